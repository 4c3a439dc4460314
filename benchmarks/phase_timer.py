"""Host time per engine phase, by wrapping methods on instances (the engine carries no timing
code).

``instrument_steps`` splits an ``LLMEngine.step`` into:

    schedule   Scheduler.schedule
    launch     the executor's execute_model_async: inputs built, the model's kernels (or
               CUDA graph) and sampling queued
    wait       the host waiting for a launched step's sampled ids (the device still busy)
    finish     the rest of applying a step's output: stop rules, outputs (wait excluded)

With async scheduling a step launches one batch and then finishes the batch before it, so
``wait`` near zero means the device idled while the host worked (host-bound steps), and a
large ``wait`` means the host was ahead of the device.

``gc`` (not a phase: it overlaps whichever phase a collection interrupts) is the time spent in
Python's cyclic garbage collector during the step.
"""
from __future__ import annotations

import gc
import time
from collections import defaultdict
from typing import Any, Callable

STEP_PHASES = ("schedule", "launch", "wait", "finish")
# One engine step: (ran prompt tokens, wall seconds, host seconds by STEP_PHASES and "gc").
StepRecord = tuple[bool, float, dict[str, float]]


class PhaseTimer:
    """Accumulates perf_counter time of wrapped callables per phase (for the current step:
    clear ``current`` before each)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self._gc_started = 0.0
        self._gc_callback: Callable[[str, dict[str, Any]], None] | None = None

    def track_gc(self) -> None:
        """Also accumulate garbage-collection pauses under "gc" (until close())."""
        if self._gc_callback is not None:
            return

        def callback(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                self._gc_started = time.perf_counter()
            else:
                self.current["gc"] += time.perf_counter() - self._gc_started

        self._gc_callback = callback
        gc.callbacks.append(callback)

    def close(self) -> None:
        if self._gc_callback is not None:
            gc.callbacks.remove(self._gc_callback)
            self._gc_callback = None

    def wrap(self, obj: Any, attr: str, phase: str) -> None:
        inner: Callable[..., Any] = getattr(obj, attr)
        current = self.current

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                current[phase] += time.perf_counter() - t0

        setattr(obj, attr, timed)


def instrument_steps(engine: Any) -> PhaseTimer:
    """Time `engine`'s steps by STEP_PHASES, and their garbage-collection pauses as "gc"
    (seconds in ``timer.current``; close() the timer when done)."""
    timer = PhaseTimer()
    timer.track_gc()
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.executor, "execute_model_async", "launch")
    finish_step = engine._finish_step
    current = timer.current

    def finish(sched_out: Any, launched: Any, *args: Any) -> Any:
        # The launched step's result() is where the host waits for the device.
        timer.wrap(launched, "result", "wait")
        t0 = time.perf_counter()
        waited = current["wait"]
        try:
            return finish_step(sched_out, launched, *args)
        finally:
            current["finish"] += time.perf_counter() - t0 - (current["wait"] - waited)
            # The wrapper refers to `launched` (a cycle): drop it, or every step's output
            # would wait for the garbage collector.
            del launched.result

    engine._finish_step = finish
    return timer
