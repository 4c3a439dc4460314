"""AsyncLLM on a real tiny engine, with and without async scheduling: concurrent requests
batch correctly (vs transformers), excess requests queue, aborts free KV blocks, one bad
request or a failed step never stops the loop, and shutdown is clean."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from test_v100.entrypoints.openai.utils import build_tiny_llama, hf_greedy
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.async_llm import AsyncLLM, EngineLoopError, RequestStream
from vllm_volta.engine.engine_errors import EngineDeadError, is_fatal
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.sampling_params import SamplingParams

MAX_NUM_SEQS = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny_llama_async")))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async-scheduling"])
def engine(model_dir, request):
    args = EngineArgs(model=model_dir, max_model_len=128, max_num_seqs=MAX_NUM_SEQS,
                      cpu_kvcache_space=0.01, seed=0, async_scheduling=request.param)
    return LLMEngine.from_engine_args(args)


class FlakyEngine:
    """Delegates to a real engine; its next step() raises when armed."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self.armed = False
        self.failure = "injected step failure"  # the message of the armed step's error
        self.gate = threading.Event()  # step() waits while it is clear
        self.gate.set()
        self.blocked = threading.Event()  # set when a step() found the gate clear
        self.added: list[str] = []

    def add_request(self, request_id, prompt, params):
        self._engine.add_request(request_id, prompt, params)
        self.added.append(request_id)

    def step(self):
        if not self.gate.is_set():
            self.blocked.set()
        self.gate.wait()
        if self.armed:
            self.armed = False
            raise RuntimeError(self.failure)
        return self._engine.step()

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.fixture
def llm(engine):
    flaky = FlakyEngine(engine)
    async_llm = AsyncLLM(flaky)
    yield async_llm, flaky
    async_llm.shutdown()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def final_output(llm: AsyncLLM, prompt, params, request_id):
    last = None
    async for out in llm.generate(prompt, params, request_id):
        last = out
    return last


async def wait_idle(llm: AsyncLLM, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = llm.get_stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and \
                stats.num_free_blocks == stats.num_total_blocks:
            return stats
        await asyncio.sleep(0.02)
    return llm.get_stats()


def test_concurrent_requests_match_transformers_and_queue(llm, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    async_llm, _ = llm
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = ["Hello world", "The quick brown fox", "Volta", "A paged KV cache stores",
               "Numbers 0123", "hello client!"]
    lengths = [5, 9, 3, 7, 4, 6]
    seen_waiting = []

    async def watch(stop: asyncio.Event):
        while not stop.is_set():
            seen_waiting.append(async_llm.get_stats().num_waiting)
            await asyncio.sleep(0.005)

    async def main():
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        outs = await asyncio.gather(*(final_output(async_llm, p, greedy(n), f"r{i}")
                                      for i, (p, n) in enumerate(zip(prompts, lengths))))
        stop.set()
        await watcher
        return outs

    outs = asyncio.run(main())
    for out, prompt, n in zip(outs, prompts, lengths):
        assert out.finished
        assert list(out.outputs[0].token_ids) == hf_greedy(model, tok.encode(prompt), n)
    # Six requests, two slots: the rest waited in the scheduler's queue instead of failing.
    assert max(seen_waiting) >= 1


def test_closing_the_stream_aborts_and_frees_blocks(llm):
    async_llm, _ = llm

    async def main():
        gen = async_llm.generate("Hello world", greedy(100), "long")
        first = await gen.__anext__()
        assert not first.finished
        assert async_llm.get_stats().num_free_blocks < async_llm.get_stats().num_total_blocks
        await gen.aclose()
        return await wait_idle(async_llm)

    stats = asyncio.run(main())
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_running == 0


async def running_task(llm: AsyncLLM, params, request_id) -> asyncio.Task:
    """A task generating from "Hello", once the engine runs it."""
    task = asyncio.create_task(final_output(llm, "Hello", params, request_id))
    while llm.get_stats().num_running == 0:
        await asyncio.sleep(0.005)
    return task


def test_cancelled_consumer_aborts(llm):
    async_llm, _ = llm

    async def main():
        task = await running_task(async_llm, greedy(100), "cancel-me")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await wait_idle(async_llm)

    stats = asyncio.run(main())
    assert stats.num_free_blocks == stats.num_total_blocks


def test_add_cancelled_before_the_engine_answers_leaves_nothing_behind(llm):
    async_llm, flaky = llm

    async def main():
        # Long enough to need steps after the gate closes, also where a step takes a millisecond.
        running = await running_task(async_llm, greedy(110), "running")
        flaky.gate.clear()  # the engine thread stops in its next step: adds wait for it
        while not flaky.blocked.is_set():
            await asyncio.sleep(0.005)
        add = asyncio.create_task(async_llm.add_request("given-up", "Hi", greedy(50)))
        await asyncio.sleep(0.05)
        assert not add.done()
        add.cancel()
        flaky.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await add
        out = await running
        return out, await wait_idle(async_llm)

    out, stats = asyncio.run(main())
    assert out.finished and len(out.outputs[0].token_ids) == 110
    assert "given-up" not in flaky.added  # the engine thread saw the cancel and skipped it
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_total_blocks


def test_bad_request_does_not_disturb_others(llm):
    async_llm, _ = llm

    async def main():
        good = asyncio.create_task(final_output(async_llm, "Hello", greedy(6), "good"))
        with pytest.raises(ValueError, match="max_model_len"):
            await final_output(async_llm, list(range(5, 300)), greedy(2), "too-long")
        with pytest.raises(ValueError, match="already in use"):
            await asyncio.gather(final_output(async_llm, "x", greedy(30), "dup"),
                                 final_output(async_llm, "y", greedy(30), "dup"))
        return await good

    out = asyncio.run(main())
    assert out.finished and len(out.outputs[0].token_ids) == 6


def test_step_failure_fails_in_flight_requests_only(llm):
    async_llm, flaky = llm

    async def main():
        gen = async_llm.generate("Hello world", greedy(50), "victim")
        await gen.__anext__()
        flaky.armed = True
        with pytest.raises(EngineLoopError, match="injected"):
            async for _ in gen:
                pass
        stats = await wait_idle(async_llm)
        assert stats.num_free_blocks == stats.num_total_blocks
        return await final_output(async_llm, "Hello again", greedy(4), "after")

    out = asyncio.run(main())
    assert out.finished and len(out.outputs[0].token_ids) == 4


def test_shutdown(engine):
    async_llm = AsyncLLM(engine)
    async_llm.shutdown()
    assert not async_llm.is_running

    async def main():
        with pytest.raises(RuntimeError, match="shut down"):
            await final_output(async_llm, "Hello", greedy(2), "late")

    asyncio.run(main())


class FanOutEngine:
    """Fake engine: once `go` is set, each step gives every request one output; a request
    finishes after `steps` of them."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.counts: dict[str, int] = {}
        self.go = threading.Event()

    def add_request(self, request_id, prompt, params) -> None:
        self.counts[request_id] = 0

    def has_unfinished_requests(self) -> bool:
        return bool(self.counts)

    def abort_request(self, request_ids) -> None:
        for rid in request_ids:
            self.counts.pop(rid, None)

    def step(self):
        if not self.go.wait(0.01):
            return []
        outputs = []
        for rid in list(self.counts):
            self.counts[rid] += 1
            finished = self.counts[rid] == self.steps
            outputs.append(SimpleNamespace(request_id=rid, finished=finished, outputs=[], error=None))
            if finished:
                del self.counts[rid]
        return outputs


def test_one_loop_wakeup_delivers_a_whole_step():
    # 8 streams x 3 steps: the engine thread wakes the event loop once per step (not once per
    # request and step), and every stream ends with its final output.
    engine = FanOutEngine(steps=3)
    async_llm = AsyncLLM(engine)

    async def main():
        streams = await asyncio.gather(*(async_llm.add_request(f"r{i}", [1], None) for i in range(8)))
        loop = asyncio.get_running_loop()
        calls = []
        schedule = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            calls.append(callback)
            return schedule(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        engine.go.set()
        finished = []
        for stream in streams:
            finished.append([out.finished async for out in stream])
        return calls, finished

    try:
        calls, finished = asyncio.run(main())
    finally:
        async_llm.shutdown()
    assert all(f[-1] and not any(f[:-1]) and len(f) <= 3 for f in finished), finished
    assert len(calls) == 3


def test_a_consumer_behind_the_engine_gets_the_newest_output():
    # Outputs are cumulative, so a stream whose consumer was away for three steps yields one
    # output, the newest (here the final one), instead of three stale ones in a row.
    engine = FanOutEngine(steps=3)
    async_llm = AsyncLLM(engine)

    async def main():
        stream = await async_llm.add_request("r0", [1], None)
        engine.go.set()
        while stream._queue.qsize() < 3:
            await asyncio.sleep(0.001)
        return [out.finished async for out in stream]

    try:
        seen = asyncio.run(main())
    finally:
        async_llm.shutdown()
    assert seen == [True]


class TimingRecorder:
    def __init__(self) -> None:
        self.first, self.gaps, self.ends = [], [], []

    def on_first_token(self, ttft_s):
        self.first.append(ttft_s)

    def on_tokens(self, inter_token_s):
        self.gaps.append(inter_token_s)

    def on_finished(self, e2e_s, finish_reason):
        self.ends.append((e2e_s, finish_reason))


def _outputs(*lengths: int, finished: bool = False) -> SimpleNamespace:
    return SimpleNamespace(finished=finished, outputs=[
        SimpleNamespace(token_ids=[7] * n, finish_reason="length" if finished else None)
        for n in lengths])


@pytest.mark.parametrize("n", [1, 2])
def test_timing_has_one_gap_per_token_when_an_output_brings_several(n):
    # An engine core process that ran ahead hands over several steps' tokens at once: the wait
    # goes to the first new token, 0 to the others (what the stream's consumer sees), and n
    # sequences stepping together count one gap per step, not per sequence.
    rec = TimingRecorder()
    llm = AsyncLLM(FanOutEngine(steps=1), stat_loggers=[rec])

    async def main():
        stream = RequestStream(llm, "r")
        t0 = stream.arrival
        for lengths, finished, at in (((2,) * n, False, 1.0), ((2,) * n, False, 1.5),
                                      ((3,) * n, False, 2.0), ((6,) * n, True, 4.0)):
            llm._record_timing(stream, _outputs(*lengths, finished=finished), t0 + at)

    try:
        asyncio.run(main())
    finally:
        llm.shutdown()
    assert rec.first == [1.0]
    assert rec.gaps == pytest.approx([0.0, 1.0, 2.0, 0.0, 0.0])
    assert rec.ends == [(pytest.approx(4.0), "length")]


def test_fatal_errors_are_told_apart():
    assert is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_fatal(RuntimeError("tensor-parallel worker failure: rank 1 exited"))
    assert is_fatal(EngineDeadError("gone"))
    assert not is_fatal(RuntimeError("injected step failure"))
    assert not is_fatal(ValueError("prompt: too long"))


def test_a_fatal_step_error_kills_the_engine(llm):
    async_llm, flaky = llm

    async def main():
        stream = await async_llm.add_request("a", [5, 6, 7], greedy(40))
        await stream.__anext__()
        flaky.failure, flaky.armed = "CUDA error: an illegal memory access was encountered", True
        with pytest.raises(EngineDeadError, match="CUDA error"):
            async for _ in stream:
                pass
        assert async_llm.failed and not async_llm.is_running  # no factory: dead for good
        with pytest.raises(EngineDeadError):
            await async_llm.add_request("b", [5, 6], greedy(2))
        assert async_llm.get_stats().num_running == 0

    asyncio.run(main())


def test_a_dead_engine_is_replaced_by_the_factory(model_dir):
    args = EngineArgs(model=model_dir, max_model_len=128, max_num_seqs=MAX_NUM_SEQS,
                      cpu_kvcache_space=0.01, seed=0)
    built: list[FlakyEngine] = []

    def factory() -> FlakyEngine:
        built.append(FlakyEngine(LLMEngine.from_engine_args(args)))
        return built[-1]

    async_llm = AsyncLLM(factory(), owns_engine=True, engine_factory=factory)

    async def main():
        stream = await async_llm.add_request("a", [5, 6, 7], greedy(40))
        await stream.__anext__()
        built[0].failure, built[0].armed = "tensor-parallel worker failure: rank 1 exited", True
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        for _ in range(600):  # the new engine loads in the loop's thread
            if async_llm.is_running:
                break
            await asyncio.sleep(0.05)
        assert async_llm.is_running and async_llm.num_restarts == 1 and len(built) == 2
        out = await final_output(async_llm, [5, 6, 7], greedy(4), "b")
        assert len(out.outputs[0].token_ids) == 4

    try:
        asyncio.run(main())
    finally:
        async_llm.shutdown()
