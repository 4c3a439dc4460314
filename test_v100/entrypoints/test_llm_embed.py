"""LLM.embed: the last prompt token's final hidden state (normalized, optionally cut to
``dimensions``) against transformers' last_hidden_state of the same model."""
from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import random_prompts, save_tiny_model
from vllm_volta import LLM
from vllm_volta.outputs import EmbeddingRequestOutput
from vllm_volta.pooling_params import PoolingParams


@pytest.fixture(scope="module", params=["qwen3", "gemma2"])
def models(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"embed_{request.param}")
    hf = save_tiny_model(path, request.param)
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", cpu_kvcache_space=0.01,
              max_num_batched_tokens=16)  # prompts longer than 16 tokens span several steps
    return hf, llm


def _reference(hf, prompt, dimensions=None, normalize=True):
    with torch.no_grad():
        vec = hf.model(torch.tensor([prompt])).last_hidden_state[0, -1].double()
    vec = vec[:dimensions] if dimensions else vec
    return vec / vec.norm() if normalize else vec


def test_embeddings_match_transformers(models):
    hf, llm = models
    prompts = random_prompts(4, 3, 40, seed=5) + [[7, 8, 9]]
    outs = llm.embed(prompts, use_tqdm=False)
    assert all(isinstance(o, EmbeddingRequestOutput) and o.error is None for o in outs)
    for prompt, out in zip(prompts, outs):
        assert out.prompt_token_ids == prompt and out.outputs.hidden_size == hf.config.hidden_size
        got = torch.tensor(out.outputs.embedding, dtype=torch.float64)
        torch.testing.assert_close(got, _reference(hf, prompt), atol=1e-4, rtol=1e-4)
        assert got.norm().item() == pytest.approx(1.0, abs=1e-5)


def test_dimensions_and_unnormalized(models):
    hf, llm = models
    prompt = random_prompts(1, 20, 20, seed=6)[0]
    params = [PoolingParams(dimensions=8), PoolingParams(normalize=False)]
    cut, raw = llm.embed([prompt, prompt], params, use_tqdm=False)
    torch.testing.assert_close(torch.tensor(cut.outputs.embedding, dtype=torch.float64),
                               _reference(hf, prompt, dimensions=8), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(raw.outputs.embedding, dtype=torch.float64),
                               _reference(hf, prompt, normalize=False), atol=1e-4, rtol=1e-4)


def test_bad_requests_fail_alone(models):
    hf, llm = models
    too_wide = PoolingParams(dimensions=hf.config.hidden_size + 1)
    bad, good = llm.embed([[5, 6], [5, 6]], [too_wide, PoolingParams()], use_tqdm=False)
    assert bad.outputs is None and "dimensions" in bad.error and good.error is None
    with pytest.raises(ValueError, match="dimensions must be a positive int"):
        PoolingParams(dimensions=0)
    # generation keeps working beside embeddings
    from vllm_volta.sampling_params import SamplingParams
    assert len(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids) == 3
