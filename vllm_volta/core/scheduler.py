"""Continuous batching: which requests run this step, and how many tokens each.

Every step has a token budget (`max_num_batched_tokens`). Running requests go first
(decodes need 1 token, unfinished prefills take what the budget allows), then waiting
requests are admitted in arrival order while the budget, `max_num_seqs` and free KV
blocks allow. When blocks run out, the most recently admitted running request is
preempted: its blocks are freed and it goes back to the front of the waiting queue to be
recomputed later (prefix caching usually makes that cheap). Nothing is dropped; a request
that could not fit even in an empty cache is finished with an error instead.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from vllm_volta.config import SchedulerConfig
from vllm_volta.core.chunk_policy import ChunkPolicy, PartialPrefills, is_decoding
from vllm_volta.core.grouped_kv_cache_manager import GroupedKVCacheManager
from vllm_volta.core.kv_cache_groups import KVCacheLayout
from vllm_volta.core.kv_cache_manager import KVCacheManager
from vllm_volta.core.request import Request, RequestStatus
from vllm_volta.logger import init_logger
from vllm_volta.structured_output import accept

logger = init_logger(__name__)


@dataclass(slots=True)  # slots: one is built per request per step
class ScheduledRequest:
    """One request's share of a step: run `num_new_tokens` tokens from `num_computed_tokens`."""

    request: Request
    num_new_tokens: int
    num_computed_tokens: int
    block_ids: list[int]
    # This step reaches the end of the known tokens, so a token is sampled.
    samples: bool
    # The tokens this step runs (self-contained for remote workers). PENDING_TOKEN marks
    # a token the previous step sampled that is still on the device (async scheduling).
    token_ids: list[int]
    # The request's recurrent-state slot (hybrid models), -1 when the model keeps none.
    state_slot: int = -1
    # Models with several KV-cache groups (core/kv_cache_groups.py): every group's block table
    # (block_ids is group 0's); None with one group.
    group_block_ids: tuple[list[int], ...] | None = None

    @property
    def req_id(self) -> str:
        return self.request.request_id

    @classmethod
    def make(cls, request: Request, num_new_tokens: int, num_computed_tokens: int,
             block_ids: list[int], state_slot: int = -1,
             group_block_ids: tuple[list[int], ...] | None = None) -> ScheduledRequest:
        # Plain attribute reads and positional arguments: the scheduler calls this once per
        # request per step.
        end = num_computed_tokens + num_new_tokens
        known = request.all_token_ids
        tokens = known[num_computed_tokens:end]
        if len(tokens) < num_new_tokens:
            tokens += [PENDING_TOKEN] * (num_new_tokens - len(tokens))
        return cls(request, num_new_tokens, num_computed_tokens, block_ids,
                   end == len(known) + request.num_pending, tokens, state_slot, group_block_ids)


PENDING_TOKEN = -1  # token ids are validated non-negative


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    total_num_scheduled_tokens: int = 0
    preempted_req_ids: set[str] = field(default_factory=set)
    # Requests that left the engine since the last step (the worker drops their state).
    finished_req_ids: set[str] = field(default_factory=set)
    # Requests finished with an error by the scheduler this step (e.g. cannot ever fit).
    errored: list[Request] = field(default_factory=list)


def stops_on_length(request: Request, max_model_len: int) -> bool:
    """Whether the request's pending tokens, once appended, finish it by length (so it
    needs no further step)."""
    num_pending = request.num_pending
    return (len(request.output_token_ids) + num_pending >= request.max_tokens
            or len(request.all_token_ids) + num_pending >= max_model_len)


def check_stop(request: Request, max_model_len: int) -> bool:
    """Token-level stop rules after a token was appended. Sets status; True if finished.

    eos (unless ignore_eos) and stop_token_ids count only once min_tokens are out;
    stop_reason is the stop token id, None for eos.
    """
    params = request.sampling_params
    output_ids = request.output_token_ids
    last = output_ids[-1]
    num_output = len(output_ids)  # not the properties: this runs per request per step
    if num_output >= params.min_tokens and params.is_stop_token(last):
        request.status = RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            request.stop_reason = last
        return True
    if num_output >= request.max_tokens or len(request.all_token_ids) >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def grammar_complete(request: Request, new_ids: list[int]) -> bool:
    """Structured outputs: feed the new tokens to the request's grammar matcher; an output the
    grammar holds complete stops there, as on a stop token. Sets status; True if finished."""
    if not accept(request.grammar, new_ids):
        return False
    request.status = RequestStatus.FINISHED_STOPPED
    return True


class Scheduler:
    """Decides each step's batch; owns the request queues and the KV cache manager."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, block_size: int,
                 enable_prefix_caching: bool, num_state_slots: int = 0,
                 kv_cache_layout: KVCacheLayout | None = None) -> None:
        """``kv_cache_layout``: the model's KV-cache groups; None reads the one the worker put on
        ``config`` when it sized the cache (``kv_cache_layout``), else one table of
        ``block_size``."""
        self.config = config
        self.max_model_len = config.max_model_len
        layout = kv_cache_layout or config.kv_cache_layout
        self.kv_cache_manager: KVCacheManager
        if layout is not None and (layout.num_groups > 1 or layout.frees_blocks):
            self.kv_cache_manager = GroupedKVCacheManager(num_blocks, layout, num_state_slots,
                                                          config.max_num_batched_tokens,
                                                          enable_prefix_caching)
        else:
            if layout is not None:
                block_size = layout.groups[0].block_size
            self.kv_cache_manager = KVCacheManager(num_blocks, block_size, enable_prefix_caching,
                                                   num_state_slots)
        self._group_tables = getattr(self.kv_cache_manager, "num_groups", 1) > 1
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._finished_since_last_step: set[str] = set()
        self.num_preemptions = 0
        # Pipeline parallelism (set by the engine): micro-batches in flight at once. Each takes
        # at most its share of the running requests, so steady decoding fills every stage.
        self.num_micro_batches = 1
        self.chunk_policy = ChunkPolicy(config)
        if config.enable_chunked_prefill:
            logger.info("Chunked prefill: %s", self.chunk_policy.describe())

    # ---- queue management -------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """Finish (stop/abort/error) requests, freeing their KV blocks. Unknown ids are ignored."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        dropped: dict[str, Request] = {}
        for rid in request_ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            dropped[rid] = request
            if not request.is_finished:
                request.status = status
            self.kv_cache_manager.free(request)
            self._finished_since_last_step.add(rid)
        if dropped:
            self._remove_from_queues(dropped)

    def _remove_from_queues(self, dropped: dict[str, Request]) -> None:
        # One pass over `running` for the whole batch (list.remove per request would be
        # O(batch^2) when many finish in one step); `waiting` only for the rest.
        num_running = len(self.running)
        self.running[:] = [r for r in self.running if r.request_id not in dropped]
        if num_running - len(self.running) < len(dropped):
            kept = [r for r in self.waiting if r.request_id not in dropped]
            if len(kept) != len(self.waiting):
                self.waiting.clear()
                self.waiting.extend(kept)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- scheduling ---------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self._finished_since_last_step)
        self._finished_since_last_step = set()
        budget = self.config.max_num_batched_tokens
        kv = self.kv_cache_manager
        partials = PartialPrefills(self.chunk_policy)

        i = 0
        # This micro-batch's share of the running requests (all of them without a pipeline).
        share = -(-len(self.running) // self.num_micro_batches)
        while i < len(self.running) and budget > 0 and len(out.scheduled) < share:
            request = self.running[i]
            if request.num_pending and (not self.config.async_scheduling
                                        or stops_on_length(request, self.max_model_len)):
                # Its sampled token is in flight: without async scheduling (pipeline-parallel
                # micro-batches) it waits for it; either way the token may end it.
                i += 1
                continue
            remaining = request.num_tokens + request.num_pending - request.num_computed_tokens
            num_new = min(remaining, budget)
            if remaining > 1:
                num_new = self._running_chunk(request, i, remaining, budget,
                                              share - len(out.scheduled) - 1, partials)
                if num_new == 0:
                    i += 1
                    continue
            while kv.allocate_slots(request, num_new) is None:
                victim = self.running.pop()  # lowest priority = admitted last
                self._preempt(victim)
                out.preempted_req_ids.add(victim.request_id)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                break
            self._add_scheduled(out, request, num_new)
            if num_new < remaining:
                partials.add(request)
            budget -= num_new
            i += 1

        chunked = self.config.enable_chunked_prefill
        idx = 0
        while (idx < len(self.waiting) and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[idx]
            if request.num_pending:
                break  # preempted with a token in flight: rejoin once it has arrived
            if not kv.can_ever_fit(request.num_tokens):
                self._finish_unfittable(out, request)
                continue
            hits, num_hit_tokens = kv.get_computed_blocks(request)
            remaining = request.num_tokens - num_hit_tokens
            if not chunked and remaining > budget:
                break
            num_new = min(remaining, budget)
            if chunked and remaining > 1:
                num_new = self.chunk_policy.cap(num_new, num_hit_tokens, self._has_decodes())
                if num_new < remaining and not partials.allows(request):
                    idx += 1  # at the partial-prefill limit: later prompts may still fit whole
                    continue
            if kv.allocate_slots(request, num_new, hits) is None:
                break
            del self.waiting[idx]
            if self.kv_cache_manager.enable_caching:
                kv.record_prefix_lookup(request.num_tokens, num_hit_tokens)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            self.running.append(request)
            self._add_scheduled(out, request, num_new)
            if num_new < remaining:
                partials.add(request)
            budget -= num_new
        return out

    def _running_chunk(self, request: Request, i: int, remaining: int, budget: int,
                       slots_left: int, partials: PartialPrefills) -> int:
        """Tokens for the prefill chunk of running request ``self.running[i]`` (0: none this
        step). Decodes behind it keep their token of the budget, so a prompt admitted before
        them never takes their turn."""
        running = self.running
        # Without async scheduling a request whose token is in flight sits this step out.
        waits = not self.config.async_scheduling
        behind = sum(1 for r in running[i + 1:] if is_decoding(r) and not (waits and r.num_pending))
        reserve = min(behind, max(slots_left, 0))
        num_new = min(remaining, budget - reserve)
        if num_new <= 0:
            return 0
        if self.config.enable_chunked_prefill:
            num_new = self.chunk_policy.cap(num_new, request.num_computed_tokens,
                                            reserve > 0 or self._has_decodes())
        if num_new < remaining and not partials.allows(request):
            return 0
        return num_new

    def _has_decodes(self) -> bool:
        """Whether a running request decodes (its streams wait on every step)."""
        return any(is_decoding(r) for r in self.running)

    def _add_scheduled(self, out: SchedulerOutput, request: Request, num_new: int) -> None:
        """Add the request's share of the step and advance it: its computed tokens count
        the step's inputs from now on, and a sampled token is pending until the step's
        output is applied (update_from_output) or rolled back (step_failed)."""
        kv = self.kv_cache_manager
        rid = request.request_id
        sched = ScheduledRequest.make(request, num_new, request.num_computed_tokens,
                                      kv.get_block_ids(rid),
                                      kv.get_state_slot(rid) if kv.has_state_slots else -1,
                                      kv.get_group_block_ids(rid) if self._group_tables else None)
        out.scheduled.append(sched)
        out.total_num_scheduled_tokens += num_new
        request.num_computed_tokens += num_new
        request.num_pending += sched.samples

    def _preempt(self, request: Request) -> None:
        # Recompute-style preemption: drop the KV, keep the tokens, requeue at the front.
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _finish_unfittable(self, out: SchedulerOutput, request: Request) -> None:
        kv = self.kv_cache_manager
        request.error = (
            f"the request needs {kv.num_blocks_for(request.num_tokens)} KV-cache blocks "
            f"({request.num_tokens} tokens) but the whole cache has {kv.num_usable_blocks}; "
            f"raise gpu_memory_utilization / cpu_kvcache_space or lower max_model_len")
        logger.warning("Request %s cannot fit the KV cache: %s", request.request_id, request.error)
        request.status = RequestStatus.FINISHED_ERROR
        self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
        out.errored.append(request)

    def step_failed(self, out: SchedulerOutput) -> None:
        """The step of `out` raised: its KV was not (fully) written, so blocks registered
        for prefix caching at scheduling time must not be shared. Requests go back to
        where they were before the step; the caller decides whether to retry or abort them."""
        # A recurrent state the failed step may have half-updated cannot be rolled back: those
        # requests recompute from the start (an empty state), as after a preemption.
        kv = self.kv_cache_manager
        restart = kv.has_state_slots
        # A sliding window's blocks may have been returned by a later step already scheduled
        # (async scheduling): those requests recompute from the start on fresh blocks.
        frees = isinstance(kv, GroupedKVCacheManager) and kv.layout.frees_blocks
        for sched in out.scheduled:
            request = sched.request
            request.num_pending -= sched.samples
            kv.uncache_uncomputed(request, sched.num_computed_tokens)
            if request.status == RequestStatus.RUNNING:
                if frees:
                    kv.free(request)
                request.num_computed_tokens = 0 if restart or frees else sched.num_computed_tokens

    # ---- results ------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput,
                           sampled_token_ids: dict[str, list[int]]) -> list[Request]:
        """Advance scheduled requests; append sampled tokens; finish on token-level stops.

        Returns the requests that received new tokens this step (finished ones included,
        already removed from the queues with their blocks freed).
        """
        advanced: list[Request] = []
        finished: list[str] = []
        max_model_len = self.max_model_len
        get_sampled = sampled_token_ids.get
        is_finished = RequestStatus.is_finished
        for sched in out.scheduled:
            if not sched.samples:
                continue
            request = sched.request
            request.num_pending -= 1
            if is_finished(request.status):
                continue  # aborted or stopped while the step ran
            # A request preempted meanwhile keeps its token: it was sampled from the full
            # context, and the recompute will include it.
            new_ids = get_sampled(request.request_id)
            if not new_ids:
                continue
            request.append_output_token_ids(new_ids)
            advanced.append(request)
            if check_stop(request, max_model_len) or (
                    request.grammar is not None and grammar_complete(request, new_ids)):
                finished.append(request.request_id)
        if finished:
            # Statuses are set already (check_stop, grammar_complete); one batch, one pass over
            # the queues.
            self.finish_requests(finished, RequestStatus.FINISHED_STOPPED)
        return advanced
