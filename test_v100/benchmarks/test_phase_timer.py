"""benchmarks/phase_timer.py: step phases of a real engine, the device wait told apart."""
from __future__ import annotations

import time

import pytest

from benchmarks.phase_timer import STEP_PHASES, PhaseTimer, instrument_steps


def test_wrap_accumulates_per_phase_and_keeps_results():
    class Work:
        def run(self, x, delay=0.0):
            time.sleep(delay)
            return x * 2

    work, timer = Work(), PhaseTimer()
    timer.wrap(work, "run", "run")
    assert work.run(3, delay=0.02) == 6
    assert work.run(4) == 8
    assert 0.02 <= timer.current["run"] < 1.0


def test_wrap_counts_time_of_a_call_that_raises():
    class Work:
        def run(self):
            time.sleep(0.01)
            raise RuntimeError("boom")

    work, timer = Work(), PhaseTimer()
    timer.wrap(work, "run", "run")
    with pytest.raises(RuntimeError, match="boom"):
        work.run()
    assert timer.current["run"] >= 0.01


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_instrument_steps_splits_wait_from_finish(async_scheduling):
    pytest.importorskip("vllm_volta.engine.llm_engine")
    from benchmarks.engine_runner import EngineRunner
    from benchmarks.utils import resolve_model

    runner = EngineRunner({"model": resolve_model(None, "tiny-llama"), "load_format": "dummy",
                           "dtype": "float32", "max_model_len": 64, "skip_tokenizer_init": True,
                           "async_scheduling": async_scheduling})
    engine = runner.engine
    timer = instrument_steps(engine)
    # A slow result(): the time the host spends in it must be booked as "wait", not "finish".
    launch = engine.executor.execute_model_async

    def slow_launch(*args, **kwargs):
        pending = launch(*args, **kwargs)
        result = pending.result

        def slow_result():
            time.sleep(0.03)
            return result()

        pending.result = slow_result
        return pending

    engine.executor.execute_model_async = slow_launch
    engine.add_request("r", [1, 2, 3], runner.sampling_params(3))
    steps = []
    while engine.has_unfinished_requests():
        timer.current.clear()
        t0 = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - t0, dict(timer.current)))
    finishing = [phases for _, phases in steps if "finish" in phases]
    assert len(finishing) == 3  # one per sampled token
    for phases in finishing:
        assert set(phases) == set(STEP_PHASES) or set(phases) == {"wait", "finish"}
        assert phases["wait"] >= 0.03
        assert phases["finish"] < 0.03
    for wall, phases in steps:
        assert sum(phases.values()) <= wall


def test_instrumented_steps_leave_no_reference_cycle_behind():
    """Each step's output is freed by reference counting, not left for the collector."""
    import gc
    import weakref

    pytest.importorskip("vllm_volta.engine.llm_engine")
    from benchmarks.engine_runner import EngineRunner
    from benchmarks.utils import resolve_model

    runner = EngineRunner({"model": resolve_model(None, "tiny-llama"), "load_format": "dummy",
                           "dtype": "float32", "max_model_len": 64, "skip_tokenizer_init": True,
                           "async_scheduling": True})
    engine = runner.engine
    instrument_steps(engine)
    launch = engine.executor.execute_model_async
    launched = []

    def tracked_launch(*args, **kwargs):
        pending = launch(*args, **kwargs)
        launched.append(weakref.ref(pending))
        return pending

    engine.executor.execute_model_async = tracked_launch
    engine.add_request("r", [1, 2, 3], runner.sampling_params(4))
    gc.disable()
    try:
        while engine.has_unfinished_requests():
            engine.step()
        held = engine._in_flight[1] if engine._in_flight is not None else None
        alive = [ref() for ref in launched if ref() is not None and ref() is not held]
        assert len(launched) >= 4
        assert alive == []
    finally:
        gc.enable()
        runner.close()


def test_track_gc_adds_collection_time_until_closed():
    import gc

    timer = PhaseTimer()
    registered = len(gc.callbacks)
    timer.track_gc()
    timer.track_gc()  # once only
    assert len(gc.callbacks) == registered + 1
    gc.collect()
    first = timer.current["gc"]
    assert first > 0
    timer.close()
    gc.collect()
    assert timer.current["gc"] == first
    assert len(gc.callbacks) == registered
    timer.close()  # a second close is harmless
    assert len(gc.callbacks) == registered
