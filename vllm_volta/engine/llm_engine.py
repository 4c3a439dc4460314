"""LLMEngine: synchronous, step-driven engine (contract in docs/ARCHITECTURE.md).

add_request -> step() ... -> RequestOutputs. Each step schedules a batch, runs it through
the executor, appends the sampled tokens, applies stop rules and reports the requests
that advanced (cumulative text and token ids).
"""
from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vllm_volta.config import VllmConfig
from vllm_volta.core.request import Request, RequestStatus
from vllm_volta.core.request_group import RequestGroup
from vllm_volta.core.scheduler import Scheduler, SchedulerOutput
from vllm_volta.core.stats import EngineStats, StatLogger
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.gc_policy import (freeze_startup_heap, raise_gc_threshold,
                                          release_startup_heap)
from vllm_volta.engine.input_processor import InputProcessor, PromptInput
from vllm_volta.executor.abstract import Executor
from vllm_volta.logger import init_logger
from vllm_volta.outputs import RequestOutput
from vllm_volta.pooling_params import PoolingParams
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.worker.model_runner import PendingOutput

__all__ = ["EngineStats", "LLMEngine"]

logger = init_logger(__name__)


class LLMEngine:
    """The engine: tokenizer, scheduler + KV cache manager, executor."""

    def __init__(self, vllm_config: VllmConfig, executor_class: type[Executor] | None = None,
                 log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.stat_logger = StatLogger() if log_stats else None
        self.tokenizer = None
        if not self.model_config.skip_tokenizer_init:
            from vllm_volta.transformers_utils.tokenizer import get_tokenizer
            mc = self.model_config
            self.tokenizer = get_tokenizer(mc.model_path, mc.tokenizer,
                                           trust_remote_code=mc.trust_remote_code,
                                           revision=mc.tokenizer_revision)
        self.eos_token_ids = self._eos_token_ids()
        self.input_processor = InputProcessor(self.model_config, self.tokenizer, self.eos_token_ids)
        executor_class = executor_class or Executor.get_class(vllm_config)
        self.executor = executor_class(vllm_config)
        try:
            num_blocks = self.executor.determine_num_available_blocks()
            self.executor.initialize_cache(num_blocks)
        except BaseException:
            self.executor.shutdown()  # free the device and any worker processes
            raise
        cc = vllm_config.cache_config
        self.scheduler = Scheduler(vllm_config.scheduler_config, num_blocks, cc.block_size,
                                   cc.enable_prefix_caching, cc.num_state_slots)
        self._groups: dict[str, RequestGroup] = {}
        # What step() reports for a request that advanced: its cumulative RequestOutput by
        # default; the engine core process reports deltas instead (core_outputs.py).
        self.output_builder: Callable[[RequestGroup], Any] = RequestGroup.make_output
        self._decode_token = None
        if self.tokenizer is not None:
            from vllm_volta.sample.logprobs import token_decoder
            self._decode_token = token_decoder(self.tokenizer)
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self.async_scheduling = vllm_config.scheduler_config.async_scheduling
        # Async scheduling: the launched step whose tokens are not applied yet.
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None
        # Async scheduling: requests whose sampling may read their output so far (penalties,
        # min_tokens), by id; their steps wait for the previous step's tokens (_can_overlap,
        # which also drops the ones done with it).
        self._history_readers: dict[str, Request] = {}
        # Pipeline parallelism: up to pipeline_parallel_size launched steps (micro-batches), oldest
        # first; the scheduler leaves their requests alone until their tokens are applied.
        self._pipeline_depth = vllm_config.parallel_config.pipeline_parallel_size
        self._pipeline: deque[tuple[SchedulerOutput, PendingOutput]] = deque()
        self.scheduler.num_micro_batches = self._pipeline_depth
        raise_gc_threshold()
        freeze_startup_heap()
        self._holds_heap_freeze = True

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(engine_args.create_engine_config(),
                   log_stats=not engine_args.disable_log_stats)

    def _eos_token_ids(self) -> set[int]:
        """eos of the tokenizer plus generation_config.json's (Llama 3 lists several)."""
        ids: set[int] = set()
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        gen_config = Path(self.model_config.model_path) / "generation_config.json"
        if gen_config.is_file():
            eos = json.loads(gen_config.read_text()).get("eos_token_id")
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        return ids

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    # ---- requests -------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptInput, params: SamplingParams | PoolingParams,
                    arrival_time: float | None = None) -> None:
        """Queue a request (PoolingParams: an embedding request, whose output carries
        ``embedding``). Bad input raises ValueError and leaves the engine untouched."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        prompt_text, token_ids, params = self.input_processor.process(prompt, params)
        pooling = params if isinstance(params, PoolingParams) else None
        if pooling is not None:
            params = pooling.sampling_params()
        params = params.clone()
        params.update_from_tokenizer(self.eos_token_ids)
        arrival_time = arrival_time if arrival_time is not None else time.time()
        mc = self.model_config
        max_tokens = params.max_tokens or max(mc.max_model_len - len(token_ids), 1)
        children = []
        for i in range(params.n):
            child_params = params
            if i > 0 and params.prompt_logprobs is not None:
                # Prompt logprobs are computed once (child 0); the others may use the cache.
                child_params = params.clone()
                child_params.prompt_logprobs = None
            child_id = request_id if params.n == 1 else f"{i}_{request_id}"
            child = Request(child_id, token_ids, child_params, max_tokens=max_tokens,
                            block_size=self.vllm_config.cache_config.block_size,
                            arrival_time=arrival_time, parent_id=request_id, index=i)
            if params.structured_outputs is not None:  # compiled by process() above (cached)
                child.grammar = self.input_processor.structured.matcher(params.structured_outputs)
            child.pooling_params = pooling
            children.append(child)
        group = RequestGroup(request_id, prompt_text, token_ids, params, children,
                             self.tokenizer, self._decode_token, arrival_time)
        for child in children:
            self.scheduler.add_request(child)
            if self.async_scheduling and child.sampling_params.reads_output_history(0):
                self._history_readers[child.request_id] = child
        self._groups[request_id] = group
        self._prompt_tokens_total += len(token_ids)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """Drop requests (unknown ids are ignored); their KV blocks are freed."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        for rid in request_ids:
            group = self._groups.pop(rid, None)
            if group is not None:
                self.scheduler.finish_requests(group.child_ids(), RequestStatus.FINISHED_ABORTED)

    def abort_all_requests(self) -> None:
        self.abort_request(list(self._groups))

    def has_unfinished_requests(self) -> bool:
        # Steps still in flight count: step() then finishes them (after an abort, say).
        return bool(self._groups) or bool(self._pipeline)

    def get_num_unfinished_requests(self) -> int:
        return len(self._groups)

    # ---- one step ---------------------------------------------------------------
    def step(self, finished_only: bool = False) -> list[RequestOutput]:
        """Run one scheduled batch; return the outputs of requests that advanced.

        `finished_only=True` builds outputs only for requests that finished (offline
        generation needs nothing else, and skipping the rest saves host time per step).

        With async scheduling a step is launched and the outputs returned are those of the
        step before it, which ran on the device meanwhile. When a request with a token in
        flight samples from its token history (penalties, unmet min_tokens), that token is
        applied first and the call returns its outputs without launching.
        """
        if self._pipeline_depth > 1:
            return self._pipeline_step(finished_only)
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and not self._can_overlap():
            return self._finish_step(*in_flight, finished_only)
        sched_out = self.scheduler.schedule()
        now = time.time()
        groups = self._groups
        for s in sched_out.scheduled:
            if not s.request.output_token_ids:  # only a request without output can be new
                groups[s.request.parent_id].mark_scheduled(now)
        try:
            launched = self.executor.execute_model_async(sched_out)
        except BaseException:
            self.scheduler.step_failed(sched_out)
            self._in_flight = in_flight
            raise
        if not self.async_scheduling:
            return self._finish_step(sched_out, launched, finished_only)
        self._in_flight = (sched_out, launched)
        return [] if in_flight is None else self._finish_step(*in_flight, finished_only)

    def _pipeline_step(self, finished_only: bool) -> list[RequestOutput]:
        """Pipeline parallelism: launch the next micro-batch, then, once pipeline_parallel_size of
        them are in flight or nothing new could be scheduled, finish the oldest (and the empty
        steps right behind it). Requests whose sampled token is in flight are not scheduled
        (Scheduler.schedule), so a batch holds only requests whose inputs are known."""
        sched_out = self.scheduler.schedule()
        now = time.time()
        for s in sched_out.scheduled:
            if not s.request.output_token_ids:
                self._groups[s.request.parent_id].mark_scheduled(now)
        try:
            launched = self.executor.execute_model_async(sched_out)
        except BaseException:
            self.scheduler.step_failed(sched_out)
            raise
        pipeline = self._pipeline
        pipeline.append((sched_out, launched))
        busy = sum(1 for out, _ in pipeline if out.scheduled)
        if sched_out.scheduled and busy < self._pipeline_depth:
            return []
        outputs = self._finish_pipelined(finished_only)
        while pipeline and not pipeline[0][0].scheduled:
            outputs += self._finish_pipelined(finished_only)
        return outputs

    def _finish_pipelined(self, finished_only: bool) -> list[RequestOutput]:
        sched_out, launched = self._pipeline.popleft()
        try:
            return self._finish_step(sched_out, launched, finished_only)
        except BaseException:
            # The steps behind it ran on a broken pipeline: roll them back as well.
            while self._pipeline:
                self.scheduler.step_failed(self._pipeline.popleft()[0])
            raise

    def _can_overlap(self) -> bool:
        """Whether the next step may launch before the in-flight step's tokens are applied:
        not if a running request with a token in flight samples from its token history."""
        readers = self._history_readers
        if not readers:  # the common case: no request has penalties or min_tokens
            return True
        for rid, r in list(readers.items()):
            if r.is_finished or not r.sampling_params.reads_output_history(
                    len(r.output_token_ids)):
                del readers[rid]  # reads its history no more
            elif r.num_pending and r.status == RequestStatus.RUNNING:
                return False
        return True

    def _finish_step(self, sched_out: SchedulerOutput, launched: PendingOutput,
                     finished_only: bool) -> list[RequestOutput]:
        """Apply a launched step's sampled tokens: stop rules, outputs."""
        try:
            runner_out = launched.result()
        except BaseException:
            if self._in_flight is not None:  # it was fed this step's tokens
                self.scheduler.step_failed(self._in_flight[0])
                self._in_flight = None
            self.scheduler.step_failed(sched_out)
            raise
        now = time.time()
        groups = self._groups
        requests = self.scheduler.requests
        for rid, chunk in runner_out.prompt_logprobs.items():
            request = requests.get(rid)
            if request is not None:  # not aborted while the step ran
                groups[request.parent_id].add_prompt_logprobs(chunk)
        for rid, embedding in runner_out.embeddings.items():
            request = requests.get(rid)
            if request is not None:
                groups[request.parent_id].embedding = embedding
        sampled = runner_out.sampled_token_ids
        advanced = self.scheduler.update_from_output(sched_out, sampled)
        logprobs = runner_out.logprobs
        # With finished_only, only groups with a finished child can need an output.
        touched: dict[str, RequestGroup] = {}
        for request in advanced:
            group = groups[request.parent_id]
            num_new = len(sampled[request.request_id])
            self._generation_tokens_total += num_new
            stop_str = group.process_tokens(request, num_new, logprobs.get(request.request_id),
                                            now)
            if stop_str is not None and not request.is_finished:
                request.stop_reason = stop_str
                request.status = RequestStatus.FINISHED_STOPPED
                self.scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_STOPPED)
            if not finished_only or request.is_finished:
                touched[group.request_id] = group
        for request in sched_out.errored:
            group = groups.get(request.parent_id)
            if group is not None:
                # One failed sample fails the request: drop its siblings too.
                group.fail(request.error or "request failed")
                self.scheduler.finish_requests(group.child_ids(), RequestStatus.FINISHED_ABORTED)
                touched[group.request_id] = group
        outputs = []
        for rid, group in touched.items():
            finished = group.finished
            if finished or not finished_only:
                outputs.append(self.output_builder(group))
            if finished:
                del groups[rid]
        if self.stat_logger is not None:
            self.stat_logger.maybe_log(self.get_stats())
        return outputs

    def get_stats(self) -> EngineStats:
        sched = self.scheduler
        kv = sched.kv_cache_manager
        return EngineStats(
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            kv_cache_usage=kv.get_usage(),
            num_free_blocks=kv.get_num_free_blocks(),
            num_total_blocks=kv.num_usable_blocks,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            num_preemptions_total=sched.num_preemptions,
            prefix_cache_queries_total=kv.prefix_cache_stats.queries,
            prefix_cache_hits_total=kv.prefix_cache_stats.hits,
        )

    def shutdown(self) -> None:
        while self._pipeline:  # answered before the workers are told to stop (answers come in order)
            try:
                self._pipeline.popleft()[1].result()
            except Exception as e:  # shutting down anyway
                logger.debug("in-flight step at shutdown: %s", e)
        self.executor.shutdown()
        if self._holds_heap_freeze:
            self._holds_heap_freeze = False
            release_startup_heap()
