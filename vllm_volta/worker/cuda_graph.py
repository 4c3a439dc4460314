"""CUDA graphs for pure-decode steps.

Decode steps launch hundreds of small kernels whose launch overhead dominates at small
batch sizes; replaying a captured graph removes it. One graph is captured per batch size
in a list (1, 2, 4, 8, 16, 24, ..., 248, 256, 272, ... up to max_num_seqs); a step with B decoding
sequences replays the smallest graph >= B with the extra rows padded (no KV writes:
slot -1, context of 1 token in the reserved null block 0).

All graphs read from one set of static input buffers and share one memory pool. They are
captured through the CUDA driver API (worker/driver_graph.py: torch.cuda.CUDAGraph slows
every replay once a process has captured four graphs with it), or with torch.cuda.CUDAGraph
where that path is unavailable or VLLM_VOLTA_CUDA_GRAPH_CAPTURE=torch. The
attention backend must be capturable (class attribute `supports_cuda_graphs`): no host
synchronisation, no shape that depends on tensor values; models with a recurrent state (hybrid
models) read it from a static per-row slot buffer, padding rows from scratch slot 0. The metadata int baked into the
graphs, max_seq_len, is min(max_model_len, max_seq_len_to_capture) (kernels size their
context split by it); steps with a longer context run eagerly. Host-side metadata fields
(query_start_loc_cpu, seq_lens_cpu) are placeholders in graph mode. Models with several KV-cache
groups (core/kv_cache_groups.py) stage the other groups' block tables and slot mappings too (two
copies each per step); with one group nothing more runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.logger import init_logger
from vllm_volta.worker.driver_graph import DriverGraph, capture_graph, choose_capture_path

if TYPE_CHECKING:
    from vllm_volta.worker.inputs import ModelInput
    from vllm_volta.worker.model_runner import ModelRunner

logger = init_logger(__name__)


def default_capture_sizes(max_num_seqs: int, requested: list[int] | None = None,
                          cap: int = 1024) -> list[int]:
    """Batch sizes to capture: vLLM's 1, 2, 4, multiples of 8 below 256, then of 16, up to
    max_num_seqs (1024 at most: the largest default, on >= 70 GiB GPUs; an eager decode
    step of that size spends milliseconds launching kernels)."""
    limit = min(max_num_seqs, cap)
    sizes = requested
    if sizes is None:
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, cap + 1, 16))
    return sorted({s for s in sizes if 1 <= s <= limit})


class CudaGraphRunner:
    """Captured decode graphs of one model + KV cache, and how to replay them."""

    def __init__(self, runner: ModelRunner, sizes: list[int]) -> None:
        self.runner = runner
        self.sizes = sizes
        self.max_size = sizes[-1]
        mc = runner.model_config
        self.max_seq_len = min(mc.max_model_len, mc.max_seq_len_to_capture)
        sizes = [g.block_size for g in runner.kv_cache_layout().groups]
        self.max_blocks = -(-self.max_seq_len // sizes[0])
        device = runner.device
        n = self.max_size
        # Rows: input ids, positions, slot mapping - one copy from ModelInput.token_table.
        self.token_table = torch.zeros(3, n, dtype=torch.int64, device=device)
        self.token_table[2].fill_(-1)
        self.input_ids, self.positions, self.slot_mapping = self.token_table.unbind(0)
        # What a padding row holds: token 0 at position 0, no KV write.
        self._pad_tokens = torch.tensor([[0], [0], [-1]], dtype=torch.int64, device=device)
        self._num_dirty = 0  # rows below this may hold a real sequence's values
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        # Hybrid models: each row's recurrent-state slot; padding rows use scratch slot 0 (their
        # 1-token context means they start from an empty state and their output is dropped).
        self.state_slots = (torch.zeros(n, dtype=torch.int32, device=device)
                            if runner.vllm_config.cache_config.num_state_slots else None)
        # KV-cache groups 1, 2, ...: (block table, slot mapping) each; a padding row: slot -1,
        # block 0.
        self.group_buffers = [(torch.zeros(n, -(-self.max_seq_len // bs), dtype=torch.int32, device=device),
                               torch.full((n,), -1, dtype=torch.int64, device=device)) for bs in sizes[1:]]
        self.graphs: dict[int, torch.cuda.CUDAGraph | DriverGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.num_replays = 0  # observable: tests and stats check graphs are really used

    @classmethod
    def capture(cls, runner: ModelRunner, max_num_seqs: int) -> CudaGraphRunner:
        sizes = default_capture_sizes(
            max_num_seqs, runner.vllm_config.scheduler_config.cuda_graph_sizes)
        graph_runner = cls(runner, sizes)
        graph_runner._capture_all()
        return graph_runner

    def _metadata(self, size: int) -> AttentionMetadata:
        # Views of the static buffers: replays see whatever was copied in before them.
        return AttentionMetadata(
            num_actual_tokens=size,
            query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size],
            slot_mapping=self.slot_mapping[:size],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32),
            seq_lens_cpu=torch.ones(size, dtype=torch.int32),
            state_slots=None if self.state_slots is None else self.state_slots[:size],
            kv_groups=((self.block_table[:size], self.slot_mapping[:size]),) + tuple(
                (table[:size], slots[:size]) for table, slots in self.group_buffers)
            if self.group_buffers else None,
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        model, kv_caches = self.runner.model, self.runner.kv_caches
        before = torch.cuda.mem_get_info(self.runner.device)[0]
        use_driver, how = choose_capture_path()
        # Largest first: later (smaller) graphs reuse the pool's memory.
        for size in reversed(self.sizes):
            md = self._metadata(size)
            args = (self.input_ids[:size], self.positions[:size], kv_caches, md)
            # The residual stream before the final norm: compute_logits applies it (ModelRunner).
            graph, out, self.pool = capture_graph(lambda: model(*args, final_norm=False),
                                                  use_driver, self.pool)
            self.graphs[size] = graph
            self.outputs[size] = out
        torch.cuda.synchronize(self.runner.device)
        used = before - torch.cuda.mem_get_info(self.runner.device)[0]
        pdl = ops.programmatic_launch(self.runner.device)
        pdl_note = ", decode kernels of 3+ rows as programmatic dependent launches" if pdl else ""
        logger.info("Captured CUDA graphs (%s%s) for decode batch sizes %s (%.0f MiB)", how, pdl_note,
                    self.sizes, used / 2**20)

    def can_run(self, inp: ModelInput) -> bool:
        md = inp.attn_metadata
        num_seqs = md.num_seqs
        return (md.max_query_len == 1 and md.num_actual_tokens == num_seqs
                and num_seqs <= self.max_size and md.max_seq_len <= self.max_seq_len
                and md.block_table.shape[1] <= self.max_blocks
                and all(md.kv_groups[g][0].shape[1] <= table.shape[1]
                        for g, (table, _) in enumerate(self.group_buffers, 1)))

    def padded_size(self, num_seqs: int) -> int:
        return next(s for s in self.sizes if s >= num_seqs)

    def load(self, inp: ModelInput) -> int:
        """Copy a decode step's inputs into the static buffers; returns the graph size.

        One launch (stage_decode_inputs: token table, or the ids replacing its input ids,
        sequence lengths, block table); padding rows are reset only where an earlier, larger
        step left real values (a padding row: no KV write, a 1-token context in the null block).
        """
        md = inp.attn_metadata
        num = md.num_seqs
        size = self.padded_size(num)
        ops.stage_decode_inputs(self.token_table, self.seq_lens, self.block_table, inp.token_table,
                                md.seq_lens, md.block_table, inp.replace_ids)
        if self.state_slots is not None:
            self.state_slots[:num].copy_(md.state_slots, non_blocking=True)
        for g, (table, slots) in enumerate(self.group_buffers, 1):
            src_table, src_slots = md.kv_groups[g]
            table[:num, :src_table.shape[1]].copy_(src_table, non_blocking=True)
            slots[:num].copy_(src_slots, non_blocking=True)
        stale = min(size, self._num_dirty)
        if stale > num:
            self.token_table[:, num:stale].copy_(self._pad_tokens.expand(3, stale - num))
            self.seq_lens[num:stale].fill_(1)
            self.block_table[num:stale, 0].zero_()
            if self.state_slots is not None:
                self.state_slots[num:stale].zero_()
            for table, slots in self.group_buffers:
                table[num:stale, 0].zero_()
                slots[num:stale].fill_(-1)
        # Rows [num, stale) are clean now; rows past `size` keep whatever they held.
        self._num_dirty = self._num_dirty if self._num_dirty > size else num
        return size

    def run(self, inp: ModelInput) -> torch.Tensor:
        num = inp.attn_metadata.num_seqs
        size = self.load(inp)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:num]
