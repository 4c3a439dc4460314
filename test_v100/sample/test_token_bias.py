"""allowed_token_ids and logit_bias: the transforms against dense plain-PyTorch references, and
the sampler with them (greedy and random rows, raw logprobs, metadata reuse)."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.sample import Sampler, SamplingMetadata
from vllm_volta.sample.metadata_cache import is_step_invariant
from vllm_volta.sample.token_bias import apply_allowed_token_ids, apply_logit_bias
from vllm_volta.sampling_params import SamplingParams

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, _CUDA])]
V = 50


def _meta(params, device="cpu"):
    return SamplingMetadata.build(params, output_token_ids=[[] for _ in params], device=device)


def test_transforms_match_dense_references():
    logits = torch.randn(4, V)
    params = [SamplingParams(temperature=0, logit_bias={3: 5.0, 40: -100.0}),
              SamplingParams(temperature=0),
              SamplingParams(temperature=0, allowed_token_ids=[7, 1, 30], logit_bias={1: 2.5}),
              SamplingParams(temperature=0, allowed_token_ids=[9])]
    meta = _meta(params)
    dense_bias = torch.zeros(4, V)
    dense_bias[0, 3], dense_bias[0, 40], dense_bias[2, 1] = 5.0, -100.0, 2.5
    allowed = torch.ones(4, V, dtype=torch.bool)
    allowed[2] = False
    allowed[2, [7, 1, 30]] = True
    allowed[3] = False
    allowed[3, 9] = True
    want = torch.where(allowed, logits, float("-inf")) + dense_bias
    got = apply_logit_bias(apply_allowed_token_ids(logits.clone(), meta.allowed_rows, meta.allowed_pairs),
                           meta.logit_bias)
    torch.testing.assert_close(got, want)
    assert apply_logit_bias(apply_allowed_token_ids(logits.clone(), None, None), None).equal(logits)


@pytest.mark.parametrize("device", DEVICES)
def test_sampler_applies_them_to_greedy_and_random_rows(device):
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    before = logits.clone()
    allowed = [4, 17, 33]
    params = [SamplingParams(temperature=0, logit_bias={11: 50.0}),
              SamplingParams(temperature=0, allowed_token_ids=allowed),
              SamplingParams(temperature=1.0, allowed_token_ids=allowed, logprobs=1),
              SamplingParams(temperature=1.0, logit_bias={t: -100.0 for t in range(1, V)})]
    meta = _meta(params, device)
    assert is_step_invariant(meta)  # nothing here depends on the tokens generated so far
    seen = set()
    for _ in range(200):
        out = Sampler()(logits.to(device), meta)
        ids = out.sampled_token_ids.tolist()
        assert ids[0] == 11  # +50 on a standard-normal row
        assert ids[1] == allowed[int(logits[1, allowed].argmax())]
        assert ids[2] in allowed
        assert ids[3] == 0  # every other id 100 below
        seen.add(ids[2])
    assert seen == set(allowed)
    # Logprobs are the model's (raw), not those of the biased distribution, as in vLLM.
    raw = torch.log_softmax(logits[2], dim=0)
    assert out.logprobs_tensors.logprobs[2, 0].item() == pytest.approx(raw[ids[2]].item(), abs=1e-5)
    assert torch.equal(logits, before)
