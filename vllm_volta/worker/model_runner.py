"""ModelRunner: one step of the model on one device (inputs -> forward -> sample)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vllm_volta.config import VllmConfig
from vllm_volta.core.kv_cache_groups import KVCacheLayout, allocate_group_caches
from vllm_volta.core.kv_cache_spec import (FullAttentionSpec, KVCacheSpec, has_recurrent_state,
                                           state_slot_bytes)
from vllm_volta.core.scheduler import PENDING_TOKEN, ScheduledRequest, SchedulerOutput
from vllm_volta.host_copy import to_device
from vllm_volta.logger import init_logger
from vllm_volta.model_executor.layers.parallel_state import (
    get_pipeline_model_parallel_rank, get_pipeline_model_parallel_world_size,
    get_tensor_model_parallel_world_size, tensor_model_parallel_broadcast)
from vllm_volta.model_executor.layers.pp_partition import get_pp_indices
from vllm_volta.sample.logprobs import compute_prompt_logprobs
from vllm_volta.sample.metadata import SamplingMetadata, make_generator
from vllm_volta.sample.metadata_cache import SamplingMetadataCache
from vllm_volta.sample.sampler import Sampler
from vllm_volta.sampling_params import SamplingType
from vllm_volta.structured_output import fill_bitmask
from vllm_volta.worker.block_table import BlockTableCache
from vllm_volta.worker.cudagraph_metrics import CudagraphMetrics
from vllm_volta.worker.inputs import ModelInput, prepare_inputs
from vllm_volta.worker.kv_groups import plan_model_groups
from vllm_volta.worker.pinned_ids import PinnedIdsPool

logger = init_logger(__name__)

# Sampled-token logprobs of one row: (token ids, logprobs, rank of the sampled token),
# token 0 being the sampled one, then the batch's top-k.
LogprobsRow = tuple[list[int], list[float], int]


@dataclass
class PromptLogprobsChunk:
    """Prompt logprobs for prompt positions start+1 .. start+len(ranks) (predicted tokens)."""

    start: int
    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, LogprobsRow] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
    embeddings: dict[str, list[float]] = field(default_factory=dict)  # embedding requests


@dataclass
class PendingOutput:
    """A launched step. Its sampled token ids (one per request of `req_ids`) are turned into
    the output by result(); with async scheduling they are still on their way to the host
    (a pinned buffer of `pool` + `ready` event), and result() waits for them."""

    output: ModelRunnerOutput
    req_ids: list[str] = field(default_factory=list)
    host_ids: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None
    pool: PinnedIdsPool | None = None
    buffer: torch.Tensor | None = None  # the pool's buffer host_ids is a view of

    def result(self) -> ModelRunnerOutput:
        if self.host_ids is not None:
            if self.ready is not None:
                self.ready.synchronize()
            self.output.sampled_token_ids = {
                rid: [token] for rid, token in zip(self.req_ids, self.host_ids.tolist())}
            self.host_ids = None
            if self.pool is not None:
                self.pool.release(self.buffer)
                self.pool = self.buffer = None
        return self.output


def _pick(items: list, rows: list[int]) -> list:
    """The step's items at the sampled `rows` (the list itself when every row samples)."""
    return items if len(rows) == len(items) else [items[i] for i in rows]


class ModelRunner:
    """Holds the model and its KV caches; runs scheduled steps.

    Seeded requests keep one torch.Generator each for their whole life (kept across
    preemption too, so a resumed request continues the same random stream).
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device,
                 is_driver: bool = True) -> None:
        self.vllm_config = vllm_config
        # Tensor-parallel ranks other than the driver run the model (its collectives need
        # every rank) but do not sample.
        self.is_driver = is_driver
        self.model_config = vllm_config.model_config
        self.block_size = vllm_config.cache_config.block_size
        self.device = device
        self.dtype = self.model_config.dtype
        self.model: torch.nn.Module | None = None
        self.attn_backend: type | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}
        self.sampling_cache = SamplingMetadataCache()
        self._block_tables = BlockTableCache()
        self._kv_layout: KVCacheLayout | None = None  # kv_cache_layout(), once the model is loaded
        self._stage_layout: KVCacheLayout | None = None  # its view of this pipeline stage's layers
        self._group_block_sizes: list[int] | None = None  # several groups: each one's block size
        self._group_tables: list[BlockTableCache] = []
        # Set by the worker when CUDA graphs are captured: pure decode steps, and the pieces
        # around attention for the other steps.
        self.graph_runner = None
        self.piecewise_runner = None
        mc = vllm_config.model_config
        self.graph_metrics = (CudagraphMetrics("NONE" if mc.enforce_eager else mc.cudagraph_mode)
                              if mc.cudagraph_metrics and is_driver else None)
        # Async scheduling: the last step's sampled ids stay on the device, and the next
        # step's PENDING_TOKEN inputs are copied from them (the rows' request ids in order).
        self.async_scheduling = vllm_config.scheduler_config.async_scheduling
        self._prev_sampled: torch.Tensor | None = None
        self._prev_req_ids: list[str] = []
        self._host_ids = PinnedIdsPool()
        # The step's packed inputs go to the device on their own stream (host_copy.to_device).
        self._input_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # The last step's request ids in row order, and its rows that want prompt logprobs
        # (kept while the batch is the same requests in the same order).
        self._step_req_ids: list[str] = []
        self._prompt_logprob_rows: list[int] = []

    # ---- setup ------------------------------------------------------------------
    def load_model(self) -> None:
        from vllm_volta.model_executor.model_loader import get_model
        from vllm_volta.platforms import current_platform
        self.attn_backend = current_platform.get_attn_backend(
            dtype=self.dtype, head_size=self.model_config.get_head_size())
        from vllm_volta.model_executor.layers.expert_parallel import expert_parallel
        with expert_parallel(self.vllm_config.parallel_config.enable_expert_parallel):
            self.model = get_model(self.model_config, self.device, attn_backend=self.attn_backend)
        from vllm_volta.attention.kv_cache_dtype import check_backend_supports, describe_kv_scales
        check_backend_supports(self.attn_backend, self.dtype, self.vllm_config.cache_config.kv_cache_dtype)
        if (line := describe_kv_scales(self.model, self.vllm_config.cache_config.kv_cache_dtype)) and self.is_driver:
            logger.info(line)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """What each layer keeps, its paged caches in the configured kv_cache_dtype."""
        from vllm_volta.attention.kv_cache_dtype import with_cache_dtype
        return with_cache_dtype(self._model_kv_cache_specs(), self.vllm_config.cache_config.kv_cache_dtype)

    def _model_kv_cache_specs(self) -> list[KVCacheSpec]:
        """What each layer keeps (core/kv_cache_spec.py): the model's own list where it has one
        (per-layer shapes, recurrent state), else the same paged cache for every layer."""
        if hasattr(self.model, "kv_cache_specs"):
            return self.model.kv_cache_specs()
        mc = self.model_config
        # This rank's kv heads (replicated when there are fewer heads than ranks), this stage's layers.
        kv_heads = max(mc.get_num_kv_heads() // get_tensor_model_parallel_world_size(), 1)
        start, end = get_pp_indices(mc.get_num_layers(), get_pipeline_model_parallel_rank(),
                                    get_pipeline_model_parallel_world_size())
        return [FullAttentionSpec(kv_heads, mc.get_head_size(), self.dtype)] * (end - start)

    def kv_cache_layout(self) -> KVCacheLayout:
        """The model's KV-cache groups (core/kv_cache_groups.py), planned once; tells each
        Attention layer its group (worker/kv_groups.py). With pipeline parallelism: the whole
        model's groups (the scheduler's), planned with the other stages (worker/pp_kv_layout.py)."""
        if self._kv_layout is None:
            if get_pipeline_model_parallel_world_size() > 1:
                from vllm_volta.model_executor.layers.parallel_state import get_tensor_model_parallel_rank
                from vllm_volta.worker.pp_kv_layout import plan_stage_groups
                layout, self._stage_layout = plan_stage_groups(
                    self.model, self.kv_cache_specs(), self.block_size, self.model_config.max_model_len,
                    get_pipeline_model_parallel_rank(), get_tensor_model_parallel_rank())
                self._kv_layout = layout
            else:
                layout = self._kv_layout = self._stage_layout = plan_model_groups(
                    self.model, self.kv_cache_specs(), self.block_size, self.model_config.max_model_len)
            self._kv_block_size = layout.groups[0].block_size
            if layout.num_groups > 1:
                self._group_block_sizes = [g.block_size for g in layout.groups]
                self._group_tables = [BlockTableCache() for _ in layout.groups[1:]]
        return self._kv_layout

    @property
    def kv_block_size(self) -> int:
        """Group 0's block size (the configured one unless its pages were unified)."""
        if self._kv_layout is None:
            self.kv_cache_layout()
        return self._kv_block_size

    def kv_cache_block_bytes(self) -> int:
        """Bytes one block id takes across this stage's cache (keys and values)."""
        self.kv_cache_layout()
        return self._stage_layout.block_bytes(self.kv_cache_specs())

    def state_pool_bytes(self) -> int:
        """Bytes of the recurrent-state pool (hybrid models; 0 otherwise)."""
        return (state_slot_bytes(self.kv_cache_specs())
                * self.vllm_config.cache_config.num_state_slots)

    def allocate_kv_caches(self, num_blocks: int, num_state_slots: int | None = None) -> list:
        if num_state_slots is None:
            num_state_slots = self.vllm_config.cache_config.num_state_slots
        self.kv_cache_layout()
        return allocate_group_caches(self.kv_cache_specs(), self._stage_layout, num_blocks,
                                     num_state_slots, self.device)

    def initialize_kv_caches(self, num_blocks: int) -> None:
        self.kv_caches = self.allocate_kv_caches(num_blocks)

    # ---- one step ---------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    @torch.inference_mode()
    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Launch one step. The sampled ids reach the host when the result is asked for
        (with async scheduling; otherwise they are there on return)."""
        if scheduler_output.finished_req_ids:
            # A finished id may come back as a new request with other params.
            self.sampling_cache.clear()
            self._step_req_ids = []
        for rid in scheduler_output.finished_req_ids:
            self.generators.pop(rid, None)
        pending = PendingOutput(ModelRunnerOutput())
        scheduled = scheduler_output.scheduled
        if not scheduled:
            return pending
        # s.request.request_id, not the req_id property: these run per request per step.
        req_ids = [s.request.request_id for s in scheduled]
        same_batch = req_ids == self._step_req_ids
        self._step_req_ids = req_ids
        inp = self._prepare_inputs(scheduled, req_ids, same_batch)
        self._prev_req_ids = []
        hidden = self._forward(inp)
        if hidden is None:  # a pipeline stage before the last: its output went to the next stage
            return pending
        self._prompt_logprobs(scheduled, inp, hidden, pending.output, same_batch)
        if inp.sample_rows:
            rows_hidden = inp.logits_hidden(hidden)
            logits = self.model.compute_logits(rows_hidden, apply_final_norm=True)
            logits = logits[:len(inp.sample_rows)]
            if self.is_driver:
                self._embed(_pick(scheduled, inp.sample_rows), rows_hidden, pending.output)
                self._sample(scheduled, req_ids, inp.sample_rows, logits, pending)
            if self.async_scheduling and get_tensor_model_parallel_world_size() > 1:
                self._share_sampled_ids(req_ids, inp.sample_rows)
        return pending

    def _embed(self, reqs: list[ScheduledRequest], rows_hidden: torch.Tensor, output: ModelRunnerOutput) -> None:
        """Embedding requests sample only at the step that completes their prompt: their row's
        final hidden state (the model's last norm applied), cut to ``dimensions`` and normalized
        as their PoolingParams ask, in float32."""
        rows = [j for j, s in enumerate(reqs) if s.request.pooling_params is not None]
        if not rows:
            return
        final = self.model.final_hidden(rows_hidden[to_device(rows, self.device, torch.int64)]).float()
        for j, vec in zip(rows, final):
            params = reqs[j].request.pooling_params
            if params.dimensions is not None:
                vec = vec[:params.dimensions]
            if params.normalize:
                vec = torch.nn.functional.normalize(vec, dim=0)
            output.embeddings[reqs[j].request.request_id] = vec.tolist()

    def _share_sampled_ids(self, step_req_ids: list[str], rows: list[int]) -> None:
        """Async scheduling with tensor parallelism: the next step's inputs hold this step's
        sampled tokens, which only the driver has. It broadcasts them on the device, after
        its sampling, so every rank fills its next inputs as the driver does and no rank
        waits for the host."""
        if self.is_driver:
            self._prev_sampled = tensor_model_parallel_broadcast(self._prev_sampled.contiguous())
            return
        ids = torch.empty(len(rows), dtype=torch.int64, device=self.device)
        self._prev_sampled = tensor_model_parallel_broadcast(ids)
        self._prev_req_ids = _pick(step_req_ids, rows)

    def _prepare_inputs(self, scheduled: list[ScheduledRequest], req_ids: list[str],
                        same_batch: bool) -> ModelInput:
        inp = prepare_inputs(scheduled, self.kv_block_size, self.device, self._block_tables,
                             self._input_stream, self._group_block_sizes, self._group_tables)
        self._fill_pending_tokens(scheduled, req_ids, same_batch, inp)
        return inp

    def _fill_pending_tokens(self, scheduled: list[ScheduledRequest], req_ids: list[str],
                             same_batch: bool, inp: ModelInput) -> None:
        """Input tokens the previous step sampled that the host has not seen (async
        scheduling): copied on the device from that step's sampled ids."""
        prev_ids = self._prev_req_ids
        if not prev_ids:
            return
        if same_batch and inp.num_tokens == len(scheduled) and req_ids == prev_ids:
            # Steady decoding: one token per row, the rows the last step sampled, in order.
            # Each row's token is the one sampled for it (pending, or already applied on the
            # host: the same value), so the whole row of ids is taken at once (by the graph's
            # input staging, or one copy: _forward).
            inp.replace_ids = self._prev_sampled
            return
        # Only a request's newest token can be pending: the last input row of its sequence.
        waiting = [i for i, s in enumerate(scheduled) if s.token_ids[-1] == PENDING_TOKEN]
        if waiting:
            rows = {rid: j for j, rid in enumerate(prev_ids)}
            dst = (inp.query_start_loc[1:] - 1)[waiting]
            src = [rows[req_ids[i]] for i in waiting]
            index = to_device(np.stack([dst, src]), self.device, torch.int64)
            inp.input_ids[index[0]] = self._prev_sampled[index[1]]

    def _forward(self, inp: ModelInput) -> torch.Tensor:
        graphs = None
        if self.graph_runner is not None and self.graph_runner.can_run(inp):
            graphs, mode = self.graph_runner, "FULL"
        elif self.piecewise_runner is not None and self.piecewise_runner.can_run(inp):
            graphs, mode = self.piecewise_runner, "PIECEWISE"
        if self.graph_metrics is not None:
            n = inp.num_tokens
            self.graph_metrics.observe(n, n if graphs is None else graphs.padded_size(n),
                                       "NONE" if graphs is None else mode)
        if graphs is not None:
            return graphs.run(inp)
        if inp.replace_ids is not None:
            inp.input_ids.copy_(inp.replace_ids)
        return self.model(inp.input_ids, inp.positions, self.kv_caches, inp.attn_metadata,
                          final_norm=False)

    def _generator_for(self, s: ScheduledRequest) -> torch.Generator | None:
        params = s.request.sampling_params
        if params.sampling_type != SamplingType.RANDOM_SEED:
            return None
        gen = self.generators.get(s.req_id)
        if gen is None:
            gen = make_generator(params.seed, s.request.index, self.device)
            self.generators[s.req_id] = gen
        return gen

    def _sample(self, scheduled: list[ScheduledRequest], step_req_ids: list[str], rows: list[int],
                logits: torch.Tensor, pending: PendingOutput) -> None:
        reqs, req_ids = _pick(scheduled, rows), _pick(step_req_ids, rows)
        metadata = self._sampling_metadata(reqs, req_ids)
        # Async on the GPU: the ids go to a pinned buffer, written by the sampling kernel itself
        # where it can (no copy launch), and are read when the step's event has completed.
        to_host = self.async_scheduling and logits.is_cuda
        host = None
        if to_host:
            pending.pool, pending.buffer = self._host_ids, self._host_ids.acquire(len(rows))
            host = pending.buffer[:len(rows)]
        grammar = None
        if metadata.structured_rows:  # structured outputs: this step's grammar masks
            constrained = metadata.structured_rows
            bitmask = fill_bitmask([reqs[j].request.grammar for j in constrained],
                                   self.model_config.get_vocab_size())
            grammar = (to_device(constrained, self.device, torch.int64), to_device(bitmask, self.device))
        result = self.sampler(logits, metadata, sampled_host=host, grammar=grammar)
        ids = result.sampled_token_ids
        output = pending.output
        pending.req_ids = req_ids
        if self.async_scheduling:
            self._prev_sampled = ids
            self._prev_req_ids = req_ids
        if to_host:
            if result.sampled_host is None:
                host.copy_(ids, non_blocking=True)
            pending.ready = torch.cuda.Event()
            pending.ready.record()
        pending.host_ids = host if to_host else ids
        if result.logprobs_tensors is not None:
            ids, lps, ranks = result.logprobs_tensors.tolists()
            for j, s in enumerate(reqs):
                if s.request.sampling_params.logprobs is not None:
                    output.logprobs[s.req_id] = (ids[j], lps[j], ranks[j])

    def _sampling_metadata(self, reqs: list[ScheduledRequest], req_ids: list[str]
                           ) -> SamplingMetadata:
        # Same requests in the same order as last step: their params did not change.
        key = tuple(req_ids)
        metadata = self.sampling_cache.get(key)
        if metadata is not None:
            return metadata
        generators = {j: g for j, s in enumerate(reqs) if (g := self._generator_for(s))}
        metadata = SamplingMetadata.build(
            [s.request.sampling_params for s in reqs],
            output_token_ids=[s.request.output_token_ids for s in reqs],
            prompt_token_ids=[s.request.prompt_token_ids for s in reqs],
            generators=generators, device=self.device)
        self.sampling_cache.put(key, metadata)
        return metadata

    def _prompt_logprobs(self, scheduled: list[ScheduledRequest], inp: ModelInput,
                         hidden: torch.Tensor, output: ModelRunnerOutput,
                         same_batch: bool) -> None:
        if not same_batch:  # a request's params never change
            self._prompt_logprob_rows = [i for i, s in enumerate(scheduled)
                                         if s.request.sampling_params.prompt_logprobs is not None]
        for i in self._prompt_logprob_rows:
            s = scheduled[i]
            num_logprobs = s.request.sampling_params.prompt_logprobs
            last = s.request.num_prompt_tokens - 1  # positions that predict a prompt token
            start = s.num_computed_tokens
            end = min(start + s.num_new_tokens, last)
            if start >= end:
                continue
            row0 = int(inp.query_start_loc[i])
            logits = self.model.compute_logits(hidden[row0:row0 + end - start], apply_final_norm=True)
            if not self.is_driver:
                continue
            next_ids = torch.tensor(s.request.prompt_token_ids[start + 1:end + 1],
                                    dtype=torch.int64, device=logits.device)
            ids, lps, ranks = compute_prompt_logprobs(logits, next_ids, num_logprobs).tolists()
            output.prompt_logprobs[s.req_id] = PromptLogprobsChunk(start, ids, lps, ranks)

    # ---- profiling ----------------------------------------------------------------
    @torch.inference_mode()
    def profile_run(self) -> None:
        """A worst-case step (the full token budget, then sampling for max_num_seqs rows)
        on a throwaway cache, so peak activation memory can be measured."""
        from vllm_volta.sampling_params import SamplingParams
        sc = self.vllm_config.scheduler_config
        num_tokens = sc.max_num_batched_tokens
        seq_len = min(self.model_config.max_model_len, num_tokens)
        num_seqs = -(-num_tokens // seq_len)
        sizes = [g.block_size for g in self.kv_cache_layout().groups]
        per_seq = [-(-seq_len // bs) for bs in sizes]  # each group's blocks, distinct ids
        hybrid = has_recurrent_state(self.kv_cache_specs())
        caches = self.allocate_kv_caches(num_seqs * sum(per_seq) + 1, num_seqs + 1 if hybrid else 0)
        num_computed, num_new = [], []
        block_ids: list[list[list[int]]] = [[] for _ in sizes]
        next_id = 1
        for i in range(num_seqs):
            num_computed.append(0)
            num_new.append(min(seq_len, num_tokens - i * seq_len))
            for g, n in enumerate(per_seq):
                block_ids[g].append(list(range(next_id, next_id + n)))
                next_id += n
        from vllm_volta.attention.metadata import build_attn_metadata, compute_positions
        md = build_attn_metadata(num_computed, num_new, block_ids[0], sizes[0], self.device,
                                 state_slots=list(range(1, num_seqs + 1)) if hybrid else None,
                                 other_groups=list(zip(block_ids[1:], sizes[1:])))
        positions = compute_positions(num_computed, num_new).to(self.device)
        input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, positions, caches, md, final_norm=False)
        if hidden is None:  # a pipeline stage before the last
            return
        num_rows = min(sc.max_num_seqs, num_tokens)
        logits = self.model.compute_logits(hidden[:num_rows], apply_final_norm=True)
        params = [SamplingParams(temperature=1.0, top_p=0.9, top_k=50)] * num_rows
        metadata = SamplingMetadata.build(params, output_token_ids=[[]] * num_rows,
                                          device=self.device)
        self.sampler(logits, metadata)
        del caches, hidden, logits
