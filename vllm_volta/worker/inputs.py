"""Flat model inputs for one step: token ids, positions, AttentionMetadata, logits rows.

Built with numpy (this runs every step, for up to max_num_seqs sequences) and moved to
the device in a handful of copies.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.core.scheduler import ScheduledRequest
from vllm_volta.host_copy import to_device
from vllm_volta.worker.block_table import BlockTableCache


@dataclass
class ModelInput:
    input_ids: torch.Tensor        # [T] int64, device (row 0 of token_table)
    positions: torch.Tensor        # [T] int64, device (row 1 of token_table)
    attn_metadata: AttentionMetadata
    # [padded_logits_rows(N)] int64, device: rows of the hidden states to sample (the first N;
    # the rest repeat row 0 and their logits are dropped)
    logits_indices: torch.Tensor
    sample_rows: list[int]         # for each of the N rows, its index in the scheduled list
    query_start_loc: np.ndarray    # [B+1] host copy, for prompt-logprob slicing
    # [3, T] int64, device: input ids, positions, slot mapping (one copy into CUDA graphs)
    token_table: torch.Tensor
    # [T] int64, device, or None: the input ids to run instead of input_ids (steady async
    # decoding: the previous step's samples), applied by whoever runs the forward
    replace_ids: torch.Tensor | None = None

    @property
    def logits_rows_identity(self) -> bool:
        """Whether logits_indices is 0, 1, ..., T - 1: every token row samples (so each sequence
        has one token) and no row is padding (steady decode at batch 1, 2, 4, ...)."""
        return self.num_tokens == len(self.sample_rows) == self.logits_indices.shape[0]

    def logits_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden-state rows [T, ...] the logits are computed for (padded_logits_rows of them):
        `hidden` itself where that is the identity, no gather launched."""
        return hidden if self.logits_rows_identity else hidden[self.logits_indices]

    @property
    def num_tokens(self) -> int:
        return self.attn_metadata.num_actual_tokens


def _align(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_logits_rows(n: int) -> int:
    """Rows the logits GEMM runs for n sampled rows: the next power of two up to 256, then the
    next multiple of 256.

    With a new row count every step (prefill steps), the host blocked in the lm_head call until
    all queued GPU work was done (40-110 ms, every other prefill step of an offline run on the
    H200, the GPU idle while the host then built the next step; cuBLAS's first use of a GEMM
    shape is the suspected cause), and with bucketed rows it did not. Up to 256 rows the lm_head
    GEMM is bound by reading its weight, so the padding costs little.
    """
    if n <= 256:
        return 0 if n == 0 else 1 << (n - 1).bit_length()
    return _align(n, 256)


def prepare_inputs(scheduled: Sequence[ScheduledRequest], block_size: int,
                   device: torch.device, block_tables: BlockTableCache | None = None,
                   copy_stream: torch.cuda.Stream | None = None,
                   group_block_sizes: Sequence[int] | None = None,
                   group_tables: Sequence[BlockTableCache] | None = None) -> ModelInput:
    """Lay the step's new tokens out back to back (the AttentionMetadata contract).

    Every input goes to the device in one copy (views of one packed buffer): each
    host->device copy costs host time per step and a gap on the device. The copy never waits
    for the device (host_copy.to_device; on `copy_stream` when given, so that it runs while the
    previous step computes). `block_tables` carries the block table from one step to the next
    (rows whose lists did not change are not rebuilt). With several KV-cache groups
    (`group_block_sizes`: every group's block size, group 0's being `block_size`), each request's
    `group_block_ids` give groups 1, 2, ... their own block table and slot mapping
    (`AttentionMetadata.kv_groups`, one more copy; `group_tables`: their BlockTableCaches).
    """
    num_seqs = len(scheduled)
    num_new = np.fromiter((s.num_new_tokens for s in scheduled), np.int64, num_seqs)
    num_computed = np.fromiter((s.num_computed_tokens for s in scheduled), np.int64, num_seqs)
    num_tokens = int(num_new.sum())
    sample_rows = [i for i, s in enumerate(scheduled) if s.samples]
    num_blocks = np.fromiter((len(s.block_ids) for s in scheduled), np.int64, num_seqs)
    max_blocks = max(int(num_blocks.max()) if num_seqs else 1, 1)

    # One buffer, one host->device copy. int64 part: [3, T] token table (ids, positions, slots)
    # | logits_indices [N padded]; then the int32 part: query_start_loc [B+1] | seq_lens [B] |
    # (hybrid models: state_slots [B] |) block_table [B, max_blocks]. Every part starts on a
    # 16-byte boundary (kernels may use vector loads).
    row = _align(num_tokens, 2)  # each token-table row 16-byte aligned
    li_at = 3 * row
    num_logits = padded_logits_rows(len(sample_rows))
    i32_at = _align(li_at + num_logits, 2)  # in int64 entries
    sl_at = _align(num_seqs + 1, 4)
    # Hybrid models: each sequence's recurrent-state slot, after seq_lens.
    has_state = num_seqs > 0 and scheduled[0].state_slot >= 0
    ss_at = sl_at + _align(num_seqs, 4)
    bt_at = ss_at + (_align(num_seqs, 4) if has_state else 0)
    num32 = bt_at + num_seqs * max_blocks
    packed = np.zeros(i32_at + -(-num32 // 2), np.int64)
    packed32 = packed[i32_at:].view(np.int32)[:num32]
    qsl = packed32[:num_seqs + 1]
    np.cumsum(num_new, out=qsl[1:])
    seq_lens = packed32[sl_at:sl_at + num_seqs]
    seq_lens[:] = num_computed + num_new
    if has_state:
        packed32[ss_at:ss_at + num_seqs] = [s.state_slot for s in scheduled]
    block_table = packed32[bt_at:].reshape(num_seqs, max_blocks)
    (block_tables or BlockTableCache()).fill([s.block_ids for s in scheduled], num_blocks,
                                             block_table)

    table = packed[:li_at].reshape(3, row)[:, :num_tokens]
    token_ids, positions, slot_mapping = table
    if num_tokens == num_seqs:  # pure decode: one token per sequence
        token_ids[:] = [s.token_ids[0] for s in scheduled]
        positions[:] = num_computed
        seq_of_token = np.arange(num_seqs)
    else:
        token_ids[:] = [t for s in scheduled for t in s.token_ids]
        # Position of flat token t of sequence i: t - qsl[i] + num_computed[i].
        positions[:] = (np.arange(num_tokens, dtype=np.int64)
                        - np.repeat(qsl[:-1] - num_computed, num_new))
        seq_of_token = np.repeat(np.arange(num_seqs), num_new)
    slot_mapping[:] = (block_table[seq_of_token, positions // block_size].astype(np.int64)
                       * block_size + positions % block_size)
    packed[li_at:li_at + len(sample_rows)] = qsl[1:][sample_rows] - 1
    kv_groups = None
    if group_block_sizes is not None and len(group_block_sizes) > 1:
        kv_groups = _group_tables(scheduled, group_block_sizes, positions, seq_of_token, device,
                                  group_tables, copy_stream)

    dev = to_device(packed, device, copy_stream=copy_stream)
    dev32 = dev[i32_at:].view(torch.int32)[:num32]
    dev_table = dev[:li_at].view(3, row)[:, :num_tokens]
    host32 = torch.from_numpy(packed32)
    attn_metadata = AttentionMetadata(
        num_actual_tokens=num_tokens,
        query_start_loc=dev32[:num_seqs + 1],
        seq_lens=dev32[sl_at:sl_at + num_seqs],
        block_table=dev32[bt_at:].view(num_seqs, max_blocks),
        slot_mapping=dev_table[2],
        max_query_len=int(num_new.max()) if num_seqs else 0,
        max_seq_len=int(seq_lens.max()) if num_seqs else 0,
        query_start_loc_cpu=host32[:num_seqs + 1],
        seq_lens_cpu=host32[sl_at:sl_at + num_seqs],
        state_slots=dev32[ss_at:ss_at + num_seqs] if has_state else None,
    )
    if kv_groups is not None:
        attn_metadata.kv_groups = ((attn_metadata.block_table, attn_metadata.slot_mapping),) + kv_groups
    return ModelInput(
        input_ids=dev_table[0],
        positions=dev_table[1],
        attn_metadata=attn_metadata,
        logits_indices=dev[li_at:li_at + num_logits],
        sample_rows=sample_rows,
        query_start_loc=qsl,
        token_table=dev_table,
    )


def _group_tables(scheduled: Sequence[ScheduledRequest], block_sizes: Sequence[int],
                  positions: np.ndarray, seq_of_token: np.ndarray, device: torch.device,
                  caches: Sequence[BlockTableCache] | None, copy_stream: torch.cuda.Stream | None
                  ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """(block table [B, max_blocks_g] int32, slot mapping [T] int64) of groups 1, 2, ... on the
    device: one packed buffer, one copy (int64 slot rows first, then the int32 tables)."""
    num_seqs, num_tokens = len(scheduled), len(positions)
    row = _align(num_tokens, 2)
    groups = range(1, len(block_sizes))
    if scheduled and scheduled[0].group_block_ids is None:
        raise RuntimeError(f"the model's KV cache has {len(block_sizes)} groups but the scheduler hands "
                           "out one block table: build the Scheduler with the worker's kv_cache_layout "
                           "(scheduler_config.kv_cache_layout, set by Worker.initialize_cache)")
    lists = [[s.group_block_ids[g] for s in scheduled] for g in groups]
    lens = [np.fromiter((len(ids) for ids in gl), np.int64, num_seqs) for gl in lists]
    widths = [max(int(n.max()) if num_seqs else 1, 1) for n in lens]
    at32, offsets = 0, []
    for w in widths:
        offsets.append(at32)
        at32 += _align(num_seqs * w, 4)
    i32_at = row * len(widths)
    packed = np.zeros(i32_at + at32 // 2, np.int64)
    packed32 = packed[i32_at:].view(np.int32)
    for k, g in enumerate(groups):
        table = packed32[offsets[k]:offsets[k] + num_seqs * widths[k]].reshape(num_seqs, widths[k])
        (caches[k] if caches is not None else BlockTableCache()).fill(lists[k], lens[k], table)
        bs = block_sizes[g]
        packed[k * row:k * row + num_tokens] = (table[seq_of_token, positions // bs].astype(np.int64) * bs
                                                + positions % bs)
    dev = to_device(packed, device, copy_stream=copy_stream)
    dev32 = dev[i32_at:].view(torch.int32)
    return tuple((dev32[offsets[k]:offsets[k] + num_seqs * widths[k]].view(num_seqs, widths[k]),
                  dev[k * row:k * row + num_tokens]) for k in range(len(widths)))
