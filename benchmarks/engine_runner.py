"""The vllm-volta side of the offline benchmarks: an LLMEngine driven step by step.

Uses the engine contract of docs/ARCHITECTURE.md (EngineArgs -> LLMEngine.from_engine_args,
add_request with token-id prompts, step until done), which is what ``LLM.generate`` does.
"""
from __future__ import annotations

import gc
import itertools
import time
from typing import Any, Sequence

import torch

from benchmarks.phase_timer import PhaseTimer, StepRecord, instrument_steps
from benchmarks.utils import log, parse_dtype


def prefill_pending(scheduler: Any) -> bool:
    """Whether the engine's next step runs prompt tokens: a request waits, or a running one has
    more than its newest token left to compute (else the step is a pure decode)."""
    return bool(scheduler.waiting) or any(
        r.num_tokens + r.num_pending - r.num_computed_tokens > 1 for r in scheduler.running)


class EngineRunner:
    """Runs batches of token-id prompts through one LLMEngine, each to exactly ``output_len``."""

    name = "vllm-volta"
    device = None  # timing syncs whatever CUDA device the engine initialised

    def __init__(self, engine_kwargs: dict[str, Any], temperature: float = 1.0) -> None:
        from vllm_volta.engine.arg_utils import EngineArgs
        from vllm_volta.engine.llm_engine import LLMEngine

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        log(f"building vllm-volta engine: {engine_kwargs}")
        self.engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs))
        self.temperature = temperature
        self._ids = itertools.count()
        self._timer: PhaseTimer | None = None  # step phases, once generate records steps

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype the engine resolved (after 'auto' and the Volta FP16 cast)."""
        return parse_dtype(self.engine.model_config.dtype)

    def sampling_params(self, output_len: int) -> Any:
        from vllm_volta.sampling_params import SamplingParams

        # No detokenization: the benchmark counts token ids, as transformers generate does.
        return SamplingParams(n=1, temperature=self.temperature, top_p=1.0, ignore_eos=True,
                              max_tokens=output_len, detokenize=False)

    def generate(self, prompts: Sequence[Sequence[int]], output_len: int,
                 step_times: list[StepRecord] | None = None) -> list[int]:
        """Add every prompt, step until all finish; returns each request's output length.

        With `step_times`, appends (prefill, seconds, phases) per engine step: whether the
        step had prompt tokens to run, its wall time (with async scheduling, one step period)
        and its host time by phase_timer.STEP_PHASES, in seconds.
        """
        params = self.sampling_params(output_len)
        request_ids = []
        for prompt in prompts:
            request_id = f"bench-{next(self._ids)}"
            self.engine.add_request(request_id, list(prompt), params)
            request_ids.append(request_id)
        lengths: dict[str, int] = {}
        if step_times is not None and self._timer is None:
            self._timer = instrument_steps(self.engine)
        while self.engine.has_unfinished_requests():
            if step_times is not None:
                prefill = prefill_pending(self.engine.scheduler)
                self._timer.current.clear()
                t0 = time.perf_counter()
            # Only finished outputs are read: skip building the others every step.
            for out in self.engine.step(finished_only=True):
                lengths[out.request_id] = len(out.outputs[0].token_ids)
            if step_times is not None:
                step_times.append((prefill, time.perf_counter() - t0, dict(self._timer.current)))
        return [lengths[r] for r in request_ids]

    def close(self) -> None:
        """Release the engine (weights, KV cache, graphs) before another backend runs."""
        if self._timer is not None:
            self._timer.close()
        self.engine.shutdown()
        del self.engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
