"""Pipeline parallelism on CPU (gloo): 2 stages reproduce transformers' greedy tokens for a dense,
a MoE and a hybrid model, with micro-batches in flight and an uneven VLLM_PP_LAYER_PARTITION."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from test_v100.worker.tiny_models import hf_greedy, random_prompts, save_tiny_model
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.executor.multiproc import MultiprocExecutor
from vllm_volta.model_executor.layers.pp_partition import PARTITION_ENV
from vllm_volta.sampling_params import SamplingParams

ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) pipeline parallelism")

MAX_TOKENS = 5


def run_pipelined(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy outputs, and the most non-empty micro-batches that were in flight at once."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    depths = []
    finish = engine._finish_pipelined

    def finish_and_record(finished_only: bool) -> list:
        depths.append(sum(1 for out, _ in engine._pipeline if out.scheduled))
        return finish(finished_only)

    engine._finish_pipelined = finish_and_record
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: list(o.outputs[0].token_ids) for o in engine.step(finished_only=True)})
    return [final[str(i)] for i in range(len(prompts))], max(depths)


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list:
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step(finished_only=True)})
    return [final[str(i)] for i in range(len(prompts))]


def check_against_transformers(path, hf_model, prompts, then: Callable[[LLMEngine], None] | None = None,
                               **engine_kwargs) -> int:
    """Greedy tokens of the pipelined engine equal transformers'; ``then(engine)`` runs before
    it shuts down. Returns the most micro-batches that were in flight at once."""
    if not torch.cuda.is_available():
        engine_kwargs.setdefault("cpu_kvcache_space", 0.01)
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), skip_tokenizer_init=True, max_num_batched_tokens=24, **engine_kwargs))
    try:
        assert isinstance(engine.executor, MultiprocExecutor)
        outs, depth = run_pipelined(engine, prompts)
        if then is not None:
            then(engine)
    finally:
        engine.shutdown()
    for prompt, out in zip(prompts, outs):
        assert out == hf_greedy(hf_model, prompt, MAX_TOKENS)
    return depth


@ON_CPU
def test_dense_uneven_partition_with_micro_batches(tmp_path, monkeypatch):
    """Llama, 3 layers as 1 + 2 (VLLM_PP_LAYER_PARTITION, which the spawned ranks inherit; vLLM's
    split would be 2 + 1): four
    requests keep both micro-batches busy (prefill chunks of a 24-token budget, then decoding
    split in halves), and every request's tokens match transformers'."""
    hf_model = save_tiny_model(tmp_path, "llama", num_hidden_layers=3)
    monkeypatch.setenv(PARTITION_ENV, "1,2")
    prompts = random_prompts(4, 3, 20, seed=2)
    detailed = SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=4, ignore_eos=True, logprobs=2,
                              prompt_logprobs=1)
    pipelined = {}

    def abort_in_flight_then_sample(engine: LLMEngine) -> None:
        stage = engine.executor.worker.model_runner.model.model.pp  # the driver's: stage 0
        assert (stage.start, stage.end) == (0, 1)
        # A request aborted while its step is in flight: its token is dropped, the others go on.
        engine.add_request("gone", prompts[0], SamplingParams(temperature=0, max_tokens=8))
        engine.step()
        assert any(s.req_id == "gone" for out, _ in engine._pipeline for s in out.scheduled)
        engine.abort_request("gone")
        pipelined["detailed"] = run(engine, prompts[1:3], detailed)

    depth = check_against_transformers(tmp_path, hf_model, prompts, abort_in_flight_then_sample,
                                       pipeline_parallel_size=2)
    assert depth == 2
    # Seeded sampling, n > 1, logprobs and prompt logprobs from the last stage equal one process's.
    single = LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path), skip_tokenizer_init=True,
                                                   max_num_batched_tokens=24, cpu_kvcache_space=0.01))
    try:
        expected = run(single, prompts[1:3], detailed)
    finally:
        single.shutdown()
    for a, b in zip(pipelined["detailed"], expected):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        for ca, cb in zip(a.outputs, b.outputs):
            for x, y in zip(ca.logprobs, cb.logprobs):
                assert x.keys() == y.keys()
                assert all(x[k].logprob == pytest.approx(y[k].logprob, abs=1e-4) for k in x)
        assert [p and set(p) for p in a.prompt_logprobs] == [p and set(p) for p in b.prompt_logprobs]


@ON_CPU
@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5"])
def test_moe_and_hybrid(tmp_path, monkeypatch, arch):
    """Qwen3-MoE (layer 1 dense) and Qwen3.5 (stage 0: the Gated DeltaNet layer and its recurrent
    state, no paged cache; stage 1: the full-attention layer), vLLM's split."""
    monkeypatch.delenv(PARTITION_ENV, raising=False)
    hf_model = save_tiny_model(tmp_path, arch, seed=1)
    check_against_transformers(tmp_path, hf_model, random_prompts(2, 3, 16, seed=3), pipeline_parallel_size=2)


@pytest.mark.parametrize("partition", ["bad", "1,1,1"])
def test_bad_partition_is_refused_before_any_rank_starts(tmp_path, monkeypatch, partition):
    save_tiny_model(tmp_path, "llama", num_hidden_layers=3)
    monkeypatch.setenv(PARTITION_ENV, partition)
    with pytest.raises(ValueError, match=PARTITION_ENV):
        EngineArgs(model=str(tmp_path), pipeline_parallel_size=2, device="cpu").create_engine_config()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "qwen3_5"])
def test_pp2_on_gpus(tmp_path, monkeypatch, arch):
    """The same on 2 GPUs (NCCL sends between the stages; the stages profile their memory together)."""
    monkeypatch.delenv(PARTITION_ENV, raising=False)
    hf_model = save_tiny_model(tmp_path, arch, seed=1, **({"num_hidden_layers": 3} if arch == "llama" else {}))
    depth = check_against_transformers(tmp_path, hf_model, random_prompts(4, 3, 20, seed=2), pipeline_parallel_size=2,
                                       dtype="float32", gpu_memory_utilization=0.2)
    assert depth == 2
