"""Chunked prefill of a long prompt on CPU (TORCH_SDPA): the attention's largest intermediate
tensor does not grow with the context, and the chunked run gives the unchunked run's tokens."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from test_v100.worker.tiny_models import save_tiny_model
from vllm_volta.attention import tiled_prefill
from vllm_volta.attention.backends.torch_sdpa import TorchSDPAImpl
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.sampling_params import SamplingParams

MAX_LEN = 4096
CHUNK = 128
_ids = itertools.count()


class _LargestNewTensor(TorchDispatchMode):
    """Bytes of the largest tensor any op allocates (outputs that alias an input are views or
    in-place results, not allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("long_llama")
    save_tiny_model(path, "llama", max_position_embeddings=MAX_LEN)
    return path


def _generate(path, prompt, budget, monkeypatch=None):
    """Greedy tokens (and the largest attention intermediate of prefill steps) for `prompt`."""
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), max_model_len=MAX_LEN, max_num_batched_tokens=budget, cpu_kvcache_space=0.02,
        skip_tokenizer_init=True, dtype="float32", enable_prefix_caching=False))
    tracker = _LargestNewTensor()
    if monkeypatch is not None:
        original = TorchSDPAImpl.forward

        def tracked(self, query, key, value, kv_cache, md):
            if md.max_query_len == 1:  # decode steps: not what this test bounds
                return original(self, query, key, value, kv_cache, md)
            with tracker:
                return original(self, query, key, value, kv_cache, md)

        monkeypatch.setattr(TorchSDPAImpl, "forward", tracked)
    rid = f"long-{next(_ids)}"
    engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                   logprobs=1))
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final = out
    engine.shutdown()
    return final.outputs[0], tracker.largest


def test_chunked_long_prefill_is_bounded_and_matches_unchunked(model_dir, monkeypatch):
    # A 256 KiB tile budget (fused CPU path: 2048-key tiles of 2 KV heads x 16 dims in fp32), so
    # the 3k-token context runs in several tiles (the default budget: past 128k tokens here).
    budget = 256 << 10
    monkeypatch.setattr(tiled_prefill, "DEFAULT_SCORE_BYTES", budget)
    g = torch.Generator().manual_seed(0)
    largest = {}
    for length in (1024, 3072):
        prompt = torch.randint(4, 384, (length,), generator=g).tolist()
        chunked, largest[length] = _generate(model_dir, prompt, CHUNK, monkeypatch)
        whole, _ = _generate(model_dir, prompt, length)  # the whole prompt in one step
        assert list(chunked.token_ids) == list(whole.token_ids)
        for a, b in zip(chunked.logprobs, whole.logprobs):
            token = next(iter(a))
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)
    # Whatever the context, no tensor passes the budget: not a [query x context] score block
    # (4 heads x CHUNK x 3072 x fp32 = 6 MiB), nor the whole context gathered per query head
    # (4 x 3072 x 16 x fp32 = 768 KiB).
    assert 0 < largest[1024] <= largest[3072] <= budget


def test_fresh_prompts_take_torchs_fused_cpu_kernel():
    """TORCH_SDPA runs a fresh prompt's causal attention on 4-D inputs because torch picks its
    fused (flash) CPU kernel for them, and the math path, which holds [heads, q, q] scores, for
    the same call on 3-D inputs."""
    from torch.nn.attention import SDPBackend

    q, k, v = (torch.randn(1, 4, 300, 16) for _ in range(3))
    assert torch._fused_sdp_choice(q, k, v, None, is_causal=True) == int(SDPBackend.FLASH_ATTENTION)
    assert torch._fused_sdp_choice(q[0], k[0], v[0], None, is_causal=True) == int(SDPBackend.MATH)
