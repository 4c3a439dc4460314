"""AttentionMetadata: how a flat batch of new tokens maps onto sequences and the paged KV cache.

The contract (docs/ARCHITECTURE.md): ``B`` sequences laid out back to back, ``T`` new tokens in
total; the new tokens of sequence ``i`` are ``[query_start_loc[i], query_start_loc[i + 1])`` and
are the LAST ``q_len`` positions of its ``seq_lens[i]``-token context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch

_T = TypeVar("_T")


@dataclass
class AttentionMetadata:
    """Per-step attention inputs shared by every attention layer of the model."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [B + 1] int32, device
    seq_lens: torch.Tensor  # [B] int32, device; context length after this step
    block_table: torch.Tensor  # [B, max_blocks] int32, device; padded with 0
    slot_mapping: torch.Tensor  # [T] int64, device; -1 = do not write
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: torch.Tensor  # [B + 1] int32, CPU
    seq_lens_cpu: torch.Tensor  # [B] int32, CPU
    # [B] int32, device: each sequence's recurrent-state slot (models with MambaSpec layers;
    # core/kv_cache_spec.py), None for models without recurrent state
    state_slots: torch.Tensor | None = None
    # Models with several KV-cache groups (core/kv_cache_groups.py): (block_table, slot_mapping)
    # of every group, in each group's own block size; the fields above are group ``kv_group``'s.
    # None with one group.
    kv_groups: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    kv_group: int = 0
    # The step's metadata per group (for_group), shared by every group's view.
    _group_views: dict[int, AttentionMetadata] = field(default_factory=dict, repr=False, compare=False)
    # Per-step values worked out by the first layer that needs them (step_cached).
    _step_cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def step_cached(self, name: str, build: Callable[[], _T]) -> _T:
        """`build()` once per metadata object, shared by every layer of the step (so the
        metadata must not be changed in place once a forward pass has used it)."""
        if name not in self._step_cache:
            self._step_cache[name] = build()
        return self._step_cache[name]

    def for_group(self, group: int) -> AttentionMetadata:
        """This step's metadata as the layers of KV-cache group ``group`` see it: that group's
        block table and slot mapping (itself with one group). One object per group and step, so
        step_cached plans are built once per group."""
        if group == self.kv_group or self.kv_groups is None:
            return self
        views = self._group_views
        if not views:
            views[self.kv_group] = self
        view = views.get(group)
        if view is None:
            block_table, slot_mapping = self.kv_groups[group]
            view = views[group] = replace(self, block_table=block_table, slot_mapping=slot_mapping,
                                          kv_group=group, _step_cache={})
        return view

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens_cpu.shape[0])

    @property
    def query_lens_cpu(self) -> torch.Tensor:
        """Number of new tokens per sequence, [B] int32 on CPU."""
        return self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]


def _check_lengths(num_computed: Sequence[int], num_new: Sequence[int],
                   block_ids: Sequence[Sequence[int]], block_size: int) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    if not (len(num_computed) == len(num_new) == len(block_ids)):
        raise ValueError(
            "num_computed, num_new and block_ids must have one entry per sequence, got lengths "
            f"{len(num_computed)}, {len(num_new)}, {len(block_ids)}")
    for i, (done, new, blocks) in enumerate(zip(num_computed, num_new, block_ids)):
        if done < 0 or new < 0:
            raise ValueError(f"num_computed[{i}] and num_new[{i}] must be >= 0, got {done}, {new}")
        if done + new > len(blocks) * block_size:
            raise ValueError(
                f"sequence {i}: {done + new} tokens need {-(-(done + new) // block_size)} blocks of "
                f"{block_size}, but block_ids[{i}] holds {len(blocks)}")


def compute_positions(num_computed: Sequence[int], num_new: Sequence[int]) -> torch.Tensor:
    """Absolute positions of the new tokens, [T] int64 on CPU (sequence i: done_i .. done_i+new_i-1)."""
    new = torch.tensor(list(num_new), dtype=torch.int64)
    done = torch.tensor(list(num_computed), dtype=torch.int64)
    starts = torch.cumsum(new, 0) - new  # flat index where each sequence begins
    flat = torch.arange(int(new.sum()), dtype=torch.int64)
    return flat - torch.repeat_interleave(starts - done, new)


def _table_and_slots(num_computed: Sequence[int], num_new: Sequence[int],
                     block_ids: Sequence[Sequence[int]], block_size: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, max_blocks] int32 block table (padded with 0) and [T] int64 slot mapping, on CPU."""
    _check_lengths(num_computed, num_new, block_ids, block_size)
    max_blocks = max((len(b) for b in block_ids), default=0)
    block_table = torch.zeros(len(block_ids), max(max_blocks, 1), dtype=torch.int32)
    for i, blocks in enumerate(block_ids):
        block_table[i, : len(blocks)] = torch.tensor(list(blocks), dtype=torch.int32)
    new = torch.tensor(list(num_new), dtype=torch.int64)
    positions = compute_positions(num_computed, num_new)
    seq_index = torch.repeat_interleave(torch.arange(len(new)), new)
    block_of_token = block_table[seq_index, positions // block_size].long()
    return block_table, block_of_token * block_size + positions % block_size


def build_attn_metadata(
    num_computed: Sequence[int],
    num_new: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    state_slots: Sequence[int] | None = None,
    other_groups: Sequence[tuple[Sequence[Sequence[int]], int]] = (),
) -> AttentionMetadata:
    """Build the metadata of one step from per-sequence lists.

    Args:
        num_computed: tokens of each sequence already in the KV cache (prefix hits included).
        num_new: tokens of each sequence computed in this step (prefill chunk or 1 for decode).
        block_ids: physical KV-cache blocks of each sequence, in logical order (group 0's).
        block_size: tokens per block (group 0's).
        device: where the device-side tensors go.
        state_slots: each sequence's recurrent-state slot (hybrid models), or None.
        other_groups: KV-cache groups 1, 2, ...: (block_ids, block_size) of each.
    """
    block_table, slot_mapping = _table_and_slots(num_computed, num_new, block_ids, block_size)
    new = torch.tensor(list(num_new), dtype=torch.int32)
    seq_lens = torch.tensor(list(num_computed), dtype=torch.int32) + new
    query_start_loc = torch.zeros(len(new) + 1, dtype=torch.int32)
    torch.cumsum(new, 0, out=query_start_loc[1:])
    device = torch.device(device)
    kv_groups = None
    if other_groups:
        kv_groups = ((block_table.to(device), slot_mapping.to(device)),) + tuple(
            tuple(t.to(device) for t in _table_and_slots(num_computed, num_new, ids, bs))
            for ids, bs in other_groups)
    return AttentionMetadata(
        num_actual_tokens=int(new.sum()),
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens.to(device),
        block_table=block_table.to(device) if kv_groups is None else kv_groups[0][0],
        slot_mapping=slot_mapping.to(device) if kv_groups is None else kv_groups[0][1],
        max_query_len=int(new.max()) if len(new) else 0,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0,
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
        state_slots=(None if state_slots is None
                     else torch.tensor(list(state_slots), dtype=torch.int32).to(device)),
        kv_groups=kv_groups,
    )
