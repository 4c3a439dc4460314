"""Pipeline parallelism over Ray actors (CPU, gloo): 2 stages in network and PID namespaces of
their own (test_ray_executor.py's harness), the last stage's actor sampling with its copies of
the requests; greedy tokens equal transformers', seeded samples and logprobs one process's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from test_v100.executor.test_ray_executor import (SEEDED, _run_in_netns, _summary, needs_netns, needs_ray,
                                                  run)
from test_v100.worker.tiny_models import hf_greedy, random_prompts, save_tiny_model
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.model_executor.layers.pp_partition import PARTITION_ENV
from vllm_volta.sampling_params import SamplingParams

PROMPTS = random_prompts(3, 3, 20, seed=12)
GREEDY = dict(temperature=0, max_tokens=5, ignore_eos=True)


def ray_pp_scenario(model: str, out_path: str, engine_kwargs: dict) -> None:
    """Runs in the child, next to a Ray head of 3 CPUs: a PP=2 engine on Ray actors."""
    too_many = None
    try:
        LLMEngine.from_engine_args(EngineArgs(model=model, distributed_executor_backend="ray",
                                              tensor_parallel_size=2, pipeline_parallel_size=2, **engine_kwargs))
    except ValueError as e:
        too_many = str(e)
    engine = LLMEngine.from_engine_args(EngineArgs(model=model, distributed_executor_backend="ray",
                                                   pipeline_parallel_size=2, **engine_kwargs))
    try:
        result = {"too_many": too_many, "executor": type(engine.executor).__name__,
                  "sampler": engine.executor._sampler,
                  "greedy": _summary(run(engine, PROMPTS, SamplingParams(**GREEDY), "g")),
                  "seeded": _summary(run(engine, PROMPTS[:2], SamplingParams(**SEEDED), "s"))}
    finally:
        engine.shutdown()
    Path(out_path).write_text(json.dumps(result))


@needs_ray
@needs_netns
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) pipeline parallelism")
def test_ray_pp2_on_cpu(tmp_path, monkeypatch):
    """Llama's 3 layers as 1 + 2 (VLLM_PP_LAYER_PARTITION reaches the actors with the engine's
    environment)."""
    model = tmp_path / "model"
    hf_model = save_tiny_model(model, "llama", num_hidden_layers=3, seed=3)
    monkeypatch.setenv(PARTITION_ENV, "1,2")
    common = dict(skip_tokenizer_init=True, max_num_batched_tokens=24, cpu_kvcache_space=0.01)
    seen = _run_in_netns("ray_pp_scenario", model, tmp_path / "result.json", common, num_gpus=0,
                         timeout=240, module="test_v100.executor.test_ray_pipeline")
    assert "tensor_parallel_size=2 x pipeline_parallel_size=2 needs 4 CPUs in the Ray cluster" in seen["too_many"]
    assert (seen["executor"], seen["sampler"]) == ("RayExecutor", 1)
    assert [s["tokens"] for s in seen["greedy"]] == [hf_greedy(hf_model, p, 5) for p in PROMPTS]
    single = LLMEngine.from_engine_args(EngineArgs(model=str(model), **common))
    try:
        one = _summary(run(single, PROMPTS[:2], SamplingParams(**SEEDED)))
    finally:
        single.shutdown()
    for pp2, pp1 in zip(seen["seeded"], one):
        assert pp2["tokens"] == pp1["tokens"]
        for a, b in zip(pp2["logprobs"], pp1["logprobs"]):
            assert a.keys() == b.keys()
            assert all(a[k] == pytest.approx(b[k], abs=1e-4) for k in a)
