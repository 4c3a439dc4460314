"""AsyncLLM over an engine core process (core_process.py): the same tokens as the engine in
the server's process, prompts restored on every output, bad input and aborts handled per
request, startup failures and a dead core reported."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
import torch
import transformers

from test_v100.entrypoints.openai.utils import build_tiny_llama
from test_v100.worker.tiny_models import hf_greedy, random_prompts, tiny_model_dir
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.async_llm import AsyncLLM, RequestError
from vllm_volta.engine.engine_errors import EngineDeadError
from vllm_volta.sampling_params import SamplingParams

PROMPTS = [[5, 9, 13, 2, 7], [3, 3, 8], [11, 4, 6, 1, 1, 9, 20], [17]]


@pytest.fixture(scope="module")
def engine_args(tmp_path_factory) -> EngineArgs:
    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tiny_llama_core"))
    return EngineArgs(model=str(model_dir), max_model_len=64, max_num_seqs=4,
                      cpu_kvcache_space=0.01, seed=0, async_scheduling=True)


@pytest.fixture(scope="module")
def core_llm(engine_args):
    llm = AsyncLLM.from_engine_args(engine_args, engine_process=True)
    yield llm
    llm.shutdown()


async def _run(llm: AsyncLLM, prompts: list[list[int]], max_tokens: int = 8) -> list[list]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    async def one(i: int, prompt: list[int]) -> list:
        return [out async for out in llm.generate(prompt, params, f"req-{i}-{id(prompts)}")]

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def test_same_tokens_as_the_engine_in_process(engine_args, core_llm):
    in_process = AsyncLLM.from_engine_args(engine_args)
    try:
        expected = asyncio.run(_run(in_process, PROMPTS))
    finally:
        in_process.shutdown()
    got = asyncio.run(_run(core_llm, PROMPTS))
    for prompt, want, have in zip(PROMPTS, expected, got):
        assert have[-1].finished and have[-1].outputs[0].token_ids == want[-1].outputs[0].token_ids
        assert len(have[-1].outputs[0].token_ids) == 8
        # Outputs cross the pipe without the prompt; the client puts it back.
        assert all(out.prompt_token_ids == prompt for out in have)
        assert [len(o.outputs[0].token_ids) for o in have] == sorted(
            len(o.outputs[0].token_ids) for o in have)
    assert core_llm.get_stats() is not None and not core_llm.engine.has_unfinished_requests()


def test_bad_request_fails_alone_and_abort_frees(core_llm):
    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            await core_llm.add_request("too-long", list(range(1, 80)), SamplingParams(max_tokens=4))
        # Abort after the first output, once alone in the engine (the client waits for the
        # core's answer) and once beside a running request (the answer comes with its steps).
        for beside in (None, [7, 8]):
            running = beside and asyncio.create_task(_run(core_llm, [beside], max_tokens=30))
            stream = await core_llm.add_request(f"to-abort-{beside}", [4, 5, 6],
                                                SamplingParams(max_tokens=40, ignore_eos=True))
            first = await stream.__anext__()
            stream.close()
            assert not first.finished
            if running:
                (outs,) = await running
                assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 30
        return await _run(core_llm, [[2, 3]], max_tokens=3)

    (outs,) = asyncio.run(main())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
    client = core_llm.engine
    assert not client.has_unfinished_requests()
    # Outputs of the aborted request still on the pipe did not bring it back; the abort's
    # answer came.
    assert not client._decoder._states and client._aborts_unanswered == 0


class ParamsTheCoreRejects(SamplingParams):
    """Passes the client's checks; the core's add_request fails on it (clone raises)."""

    def clone(self):
        raise ValueError("no room for this one")


def test_a_failed_add_in_the_core_fails_that_request_alone(core_llm):
    async def main():
        doomed = await core_llm.add_request("doomed", [4, 5], ParamsTheCoreRejects(max_tokens=5))
        with pytest.raises(RequestError, match="no room for this one"):
            async for _ in doomed:
                pass
        return await _run(core_llm, [[2, 3]], max_tokens=3)

    (outs,) = asyncio.run(main())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
    assert not core_llm.engine.has_unfinished_requests()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) tensor parallelism")
def test_tensor_parallel_workers_start_from_the_engine_process(tmp_path_factory):
    """The core process starts the rank processes itself (so it cannot be a daemon)."""
    path = tiny_model_dir(tmp_path_factory, "qwen2")  # 4 heads, 2 kv heads: 1 per rank
    prompts = random_prompts(3, 3, 20, seed=2)
    common = dict(model=str(path), skip_tokenizer_init=True, cpu_kvcache_space=0.01,
                  dtype="float32")
    tp2 = AsyncLLM.from_engine_args(EngineArgs(tensor_parallel_size=2, **common),
                                    engine_process=True)
    try:
        got = asyncio.run(_run(tp2, prompts))
    finally:
        tp2.shutdown()
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert [outs[-1].outputs[0].token_ids for outs in got] == [
        hf_greedy(hf_model, prompt, 8) for prompt in prompts]


def test_startup_failure_is_reported(tmp_path):
    args = EngineArgs(model=str(tmp_path / "missing"), max_model_len=64)
    with pytest.raises(Exception, match="missing|does not exist|config"):
        AsyncLLM.from_engine_args(args, engine_process=True)


def test_a_dead_core_fails_the_requests_in_flight(engine_args):
    llm = AsyncLLM.from_engine_args(engine_args, engine_process=True)

    async def main():
        stream = await llm.add_request("r", [4, 5, 6], SamplingParams(max_tokens=60,
                                                                      ignore_eos=True))
        await stream.__anext__()
        llm.engine._proc.kill()
        with pytest.raises(EngineDeadError, match="engine core"):
            async for _ in stream:
                pass
        # The engine is dead, not just this request: new requests fail at once, and the
        # stats no longer count the request that was running.
        assert llm.dead is not None and not llm.is_running
        with pytest.raises(EngineDeadError):
            await llm.add_request("s", [4, 5], SamplingParams(max_tokens=2))
        assert llm.get_stats().num_running == 0

    try:
        asyncio.run(main())
    finally:
        llm.shutdown()


_SERVER_THAT_DIES = """
import sys
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.async_llm import AsyncLLM
llm = AsyncLLM.from_engine_args(EngineArgs(model=sys.argv[1], max_model_len=64,
                                           cpu_kvcache_space=0.01), engine_process=True)
print("core pid", llm.engine._proc.pid, flush=True)
sys.stdin.read()
"""


def test_the_core_exits_when_its_server_is_killed(tmp_path_factory):
    """The core is not a daemon (tensor-parallel ranks are its children), so it must leave by
    itself when the server process dies without shutting it down: its pipe breaks."""
    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tiny_llama_orphan"))
    server = subprocess.Popen([sys.executable, "-c", _SERVER_THAT_DIES, str(model_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("core pid"):
            line = server.stdout.readline()
            assert line, "the server exited before its core started"
        core_pid = int(line.split()[-1])
        assert _alive(core_pid)
    finally:
        server.kill()
        server.wait()
    deadline = time.monotonic() + 30
    while _alive(core_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(core_pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_pipe_writer_sends_in_order_and_reports_a_gone_client():
    import multiprocessing
    import pickle

    from vllm_volta.engine.core_process import _PipeWriter

    ours, theirs = multiprocessing.Pipe()
    writer = _PipeWriter(ours, max_queued=2)  # a full queue makes send() wait
    sent = [("step", list(range(i)), {"i": i}) for i in range(50)]
    for msg in sent:
        writer.send(msg)
    assert [theirs.recv() for _ in sent] == sent
    # Pickled when handed over: a later change of the sender's object is not sent.
    items = [1]
    writer.send(("step", items))
    items.append(2)
    writer.close()
    assert pickle.loads(theirs.recv_bytes()) == ("step", [1])

    ours, theirs = multiprocessing.Pipe()
    writer = _PipeWriter(ours)
    theirs.close()
    with pytest.raises(BrokenPipeError, match="client is gone"):
        for _ in range(1000):  # the thread's failed send surfaces on a later call
            writer.send(("step", [0] * 1000))
            time.sleep(0.01)
    writer.close()

    # A client that stopped reading (it asked the core to stop) is not waited for.
    ours, theirs = multiprocessing.Pipe()
    writer = _PipeWriter(ours, max_queued=2)
    for _ in range(3):  # more than the socket's buffer: the thread blocks in its send
        writer.send(("step", [0] * 200_000))
    start = time.monotonic()
    writer.close(timeout=0.5)
    assert time.monotonic() - start < 2.0
