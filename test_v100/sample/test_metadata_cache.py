"""SamplingMetadataCache: reuse only while the rows and their step-invariant state match."""
from __future__ import annotations

import pytest
import torch

from vllm_volta.sample.metadata import SamplingMetadata
from vllm_volta.sample.metadata_cache import SamplingMetadataCache
from vllm_volta.sampling_params import SamplingParams


def build(params, outputs):
    return SamplingMetadata.build(params, output_token_ids=outputs,
                                  prompt_token_ids=[[5, 6]] * len(params))


def test_hit_only_for_the_same_key():
    cache = SamplingMetadataCache()
    md = build([SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0)],
               [[1], [2]])
    cache.put(("a", "b"), md)
    assert cache.get(("a", "b")) is md
    assert cache.get(("b", "a")) is None and cache.get(("a",)) is None
    assert cache.num_hits == 1
    cache.clear()
    assert cache.get(("a", "b")) is None


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, presence_penalty=0.5),   # needs the token history
    SamplingParams(temperature=1.0, repetition_penalty=1.2),
    SamplingParams(temperature=1.0, min_tokens=4, stop_token_ids=[7]),  # mask lapses
])
def test_per_step_state_is_never_reused(params):
    cache = SamplingMetadataCache()
    cache.put(("a",), build([params], [[1]]))
    assert cache.get(("a",)) is None


def test_engine_reuses_metadata_with_identical_samples(tmp_path):
    """Seeded random sampling: the same tokens with the cache as with a fresh build per step."""
    from test_v100.worker.tiny_models import random_prompts, save_tiny_model
    from vllm_volta.engine.arg_utils import EngineArgs
    from vllm_volta.engine.llm_engine import LLMEngine

    save_tiny_model(tmp_path, "llama")
    prompts = random_prompts(3, 3, 9, seed=1)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=11 + i, max_tokens=12,
                             ignore_eos=True) for i in range(3)]

    def generate(use_cache: bool) -> tuple[list[list[int]], int]:
        engine = LLMEngine.from_engine_args(EngineArgs(
            model=str(tmp_path), cpu_kvcache_space=0.01, skip_tokenizer_init=True,
            dtype="float32"))
        runner = engine.executor.worker.model_runner
        if not use_cache:
            runner.sampling_cache.get = lambda key: None
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(f"r{i}", prompt, p)
        final = {}
        while engine.has_unfinished_requests():
            for out in engine.step(finished_only=True):
                final[out.request_id] = list(out.outputs[0].token_ids)
        engine.shutdown()
        return [final[f"r{i}"] for i in range(3)], runner.sampling_cache.num_hits

    cached, hits = generate(True)
    fresh, _ = generate(False)
    assert hits >= 8  # steady decode steps reused the metadata
    assert cached == fresh
    assert all(len(t) == 12 for t in cached)
    assert torch.tensor(cached).unique().numel() > 3  # really random sampling
