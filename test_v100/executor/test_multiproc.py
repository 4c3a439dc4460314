"""Tensor parallelism on CPU (gloo): 2 ranks reproduce transformers and the 1-rank engine."""
from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import hf_greedy, random_prompts, tiny_model_dir
from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import ScheduledRequest, SchedulerOutput
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.executor.multiproc import MultiprocExecutor, slim_scheduler_output
from vllm_volta.sampling_params import SamplingParams


def run(engine, prompts, params):
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step(finished_only=True)})
    return [final[str(i)] for i in range(len(prompts))]


def test_slim_schedule_keeps_what_workers_read():
    req = Request("a", list(range(50)), SamplingParams(prompt_logprobs=2), max_tokens=4,
                  block_size=16)
    out = SchedulerOutput(scheduled=[ScheduledRequest.make(req, 20, 16, [3, 4])],
                          total_num_scheduled_tokens=20, finished_req_ids={"x"})
    slim = slim_scheduler_output(out).scheduled[0]
    assert (slim.token_ids, slim.num_computed_tokens, slim.num_new_tokens, slim.block_ids,
            slim.samples) == (list(range(16, 36)), 16, 20, [3, 4], False)
    assert (slim.request.request_id, slim.request.num_prompt_tokens,
            slim.request.sampling_params.prompt_logprobs) == ("a", 50, 2)
    assert not hasattr(slim.request, "all_token_ids")


# With async scheduling the ranks get the driver's sampled ids by a broadcast on the device,
# and every step launches before the previous one's tokens reach the host.
ASYNC = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@ASYNC
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) tensor parallelism")
def test_tp2_on_cpu(tmp_path_factory, async_scheduling):
    check_tp2(tmp_path_factory, cpu_kvcache_space=0.01, async_scheduling=async_scheduling)


@ASYNC
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_tp2_on_gpus(tmp_path_factory, async_scheduling):
    check_tp2(tmp_path_factory, dtype="float32", gpu_memory_utilization=0.2,
              async_scheduling=async_scheduling)


def check_tp2(tmp_path_factory, **engine_kwargs):
    """2 ranks reproduce transformers' greedy tokens, and the 1-rank engine's seeded samples,
    logprobs and prompt logprobs."""
    path = tiny_model_dir(tmp_path_factory, "qwen2")  # 4 heads, 2 kv heads: 1 per rank
    import transformers
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = random_prompts(4, 3, 40, seed=6)
    common = dict(model=str(path), skip_tokenizer_init=True, max_num_batched_tokens=32,
                  **engine_kwargs)
    tp = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=2, **common))
    try:
        assert isinstance(tp.executor, MultiprocExecutor)
        greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        outs = run(tp, prompts, greedy)
        for prompt, out in zip(prompts, outs):
            assert list(out.outputs[0].token_ids) == hf_greedy(hf_model, prompt, 6)
        detailed = SamplingParams(temperature=0.7, seed=3, max_tokens=5, ignore_eos=True,
                                  logprobs=2, prompt_logprobs=1)
        tp_out = run(tp, prompts[:2], detailed)
    finally:
        tp.shutdown()
    single = LLMEngine.from_engine_args(EngineArgs(**common))
    one_out = run(single, prompts[:2], detailed)
    for a, b in zip(tp_out, one_out):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.keys() == y.keys()
            assert all(x[k].logprob == pytest.approx(y[k].logprob, abs=1e-4) for k in x)
        assert [p and set(p) for p in a.prompt_logprobs] == [p and set(p) for p in b.prompt_logprobs]
    with pytest.raises(RuntimeError, match="shut down"):
        tp.executor.execute_model(SchedulerOutput())


class _FakeConn:
    """The pipe end of a worker rank: pickled calls in, replies recorded."""

    def __init__(self, calls):
        import pickle

        self.calls = [pickle.dumps(call) for call in calls]
        self.sent = []

    def recv_bytes(self):
        return self.calls.pop(0)

    def send(self, message):
        self.sent.append(message)


@pytest.mark.parametrize("cache_fails", [False, True], ids=["built", "cache-failed"])
def test_a_worker_rank_freezes_its_heap_once_its_cache_is_built(monkeypatch, cache_fails):
    import gc

    from vllm_volta.engine import gc_policy
    from vllm_volta.executor import multiproc

    frozen = {}

    class FakeWorker:
        def __init__(self, *args):
            pass

        def load_model(self):
            pass

        def determine_num_available_blocks(self):
            frozen["sizing"] = gc.get_freeze_count()
            return 7

        def initialize_cache(self, num_blocks):
            if cache_fails:
                raise RuntimeError("out of memory")

        def execute_model(self, scheduler_output):
            frozen["step"] = gc.get_freeze_count()

        def shutdown(self):
            pass

    monkeypatch.setattr(multiproc, "Worker", FakeWorker)
    monkeypatch.setattr(gc_policy, "_engines_holding_freeze", 0)
    saved_threshold = gc.get_threshold()
    gc.unfreeze()
    conn = _FakeConn([("determine_num_available_blocks", ()), ("initialize_cache", (7,)),
                      ("execute_model", (None,)), ("shutdown", ())])
    try:
        multiproc._worker_main(None, 1, 2, "file:///unused", conn)
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved_threshold)
    assert frozen["sizing"] == 0
    if cache_fails:
        assert conn.sent[2][0] == "error" and "out of memory" in conn.sent[2][1]
        assert frozen["step"] == 0
    else:
        assert conn.sent == [("ok", None), ("ok", 7), ("ok", None), ("ok", None), ("ok", None)]
        assert frozen["step"] > 0
