"""4-bit layers quantized in activation order, moved into AWQ's layout once their tensors loaded.

With activation order (GPTQ ``desc_act``, compressed-tensors ``actorder: group``) input row k
belongs to group g_idx[k], and the rows of one group are scattered. Sorting the rows by g_idx
(perm = argsort(g_idx), stable) makes every group a contiguous run; when each group then has
exactly group_size rows (always so for a whole layer, and for a column-parallel shard), the
sorted weight is an ordinary grouped 4-bit weight: it is repacked into AWQ's layout and
x W = x[:, perm] W[perm], so awq_gemv / awq_dequantize serve it like any AWQ layer. A
row-parallel rank's slice of rows (tp > 1) generally holds uneven parts of groups and stays in
packed_int.py's "rows" layout (dequantized by g_idx).

The layer's parameters keep their names; their data take the new layout (qweight [K, N/8], the
zeros [G, N/8]: the same or fewer int32s), and ``quant_perm`` holds perm.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm_volta.model_executor.layers.quantization.awq import pack_awq


def layer_shard_ids(layer: nn.Module) -> tuple[Any, ...]:
    """The shard ids a layer's loaders take: gate/up indices, "q"/"k"/"v", or just None."""
    if hasattr(layer, "output_sizes"):
        return tuple(range(len(layer.output_sizes)))
    if hasattr(layer, "q_size"):
        return ("q", "k", "v")
    return (None,)


def note_loaded(layer: nn.Module, role: str, shard: tuple[Any, ...], roles: tuple[str, ...],
                permute: Any) -> None:
    """Record that ``role`` of ``shard`` (() = every shard) loaded; once all ``roles`` of every
    shard have, call ``permute(layer)``."""
    done: set[tuple[str, Any]] = layer.__dict__.setdefault("quant_loaded", set())
    ids = layer_shard_ids(layer)
    done.update((role, s) for s in (shard or ids))
    if all((r, s) in done for r in roles for s in ids):
        permute(layer)


def sorted_group_rows(g_idx: torch.Tensor, groups: int, group_size: int) -> torch.Tensor | None:
    """perm sorting the rows by group, or None when the groups are not all ``group_size`` rows."""
    g = g_idx.long()
    if g.numel() != groups * group_size or not bool((torch.bincount(g, minlength=groups) == group_size).all()):
        return None
    return torch.argsort(g, stable=True)


def to_awq_layout(qrows: torch.Tensor, zeros: torch.Tensor, perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight [K, N/8], zeros [G, N/8]) in AWQ's layout from unpacked 4-bit rows [K, N] and
    zeros [G, N], the rows taken in ``perm``'s order."""
    return pack_awq(qrows.index_select(0, perm)), pack_awq(zeros)
