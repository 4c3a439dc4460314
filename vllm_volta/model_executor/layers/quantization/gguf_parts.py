"""A GGUF linear layer's weight as parts: runs of output rows, each in the GGUF blocks of one type.

A layer's checkpoint tensors (q / k / v, gate / up, or one) arrive as uint8 [rows, row_bytes]
blocks (model_loader/gguf_blocks.py). Which of a tensor's rows this rank holds, and where in the
layer's output they go, is exactly what the layer's own tensor-parallel weight loader does with
a dense tensor: it is asked once, with row numbers as the values (``_row_map``), so kv-head
replication and every fused layout follow the same rules as dense weights. A row-parallel layer
keeps all rows and this rank's blocks of each row (K split on block boundaries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from gguf import GGMLQuantizationType
from torch import nn

from vllm_volta.model_executor.model_loader.gguf_blocks import KEPT_TYPES, block_qtype, block_size
from vllm_volta.model_executor.model_loader.gguf_dequant import dequantize

_ALIGN = 16  # bytes: each part starts where the kernels' vector loads may read it


@dataclass
class Part:
    """Output rows [row0, row0 + rows) of a layer, as GGUF blocks uint8 [rows, row_bytes]."""

    qtype: GGMLQuantizationType
    row0: int
    rows: int
    blocks: torch.Tensor
    tensors: int = 1  # checkpoint tensors whose rows it holds


def _is_row_parallel(layer: nn.Module) -> bool:
    from vllm_volta.model_executor.layers.linear import RowParallelLinear

    return isinstance(layer, RowParallelLinear)


def _total_k(layer: nn.Module) -> int:
    return layer.input_size * (layer.tp_size if _is_row_parallel(layer) else 1)


def why_not_blocks(layer: nn.Module, pending: dict[Any, torch.Tensor]) -> str | None:
    """None when every tensor of the layer can stay in blocks, else why it cannot."""
    for tensor in pending.values():
        qtype = block_qtype(tensor)
        if qtype is None or qtype not in KEPT_TYPES:
            kept = ", ".join(sorted(t.name for t in KEPT_TYPES))
            return f"checkpoint tensors of types other than {kept}"
        elems = block_size(qtype)[0]
        if _is_row_parallel(layer) and layer.input_size % elems:
            return (f"a row-parallel layer's {layer.input_size} inputs per rank (tensor parallel size "
                    f"{layer.tp_size}) are not whole {qtype.name} blocks of {elems}")
    return None


def _row_map(layer: nn.Module, shard_id: Any, rows: int) -> tuple[int, torch.Tensor]:
    """(first output row, source rows) of this rank's share of a checkpoint tensor of ``rows`` rows:
    the layer's weight loader run on row numbers."""
    probe = torch.full((layer.output_size, 1), -1.0, dtype=torch.float64, device="cpu")
    numbers = torch.arange(rows, dtype=torch.float64, device="cpu").unsqueeze(1)
    layer.weight_loader(probe, numbers, *(() if shard_id is None else (shard_id,)))
    dst = (probe[:, 0] >= 0).nonzero().flatten()
    if dst.numel() == 0 or int(dst[-1] - dst[0]) + 1 != dst.numel():
        raise ValueError(f"GGUF shard {shard_id!r}: this rank's rows are not one run of the layer's outputs")
    return int(dst[0]), probe[dst, 0].long()


def _rank_blocks(layer: nn.Module, tensor: torch.Tensor, shard_id: Any) -> tuple[int, torch.Tensor]:
    """(first output row, this rank's blocks) of one checkpoint tensor."""
    qtype = block_qtype(tensor)
    elems, nbytes = block_size(qtype)
    k = _total_k(layer)
    if tensor.dim() != 2 or tensor.shape[1] != k // elems * nbytes:
        raise ValueError(f"GGUF {qtype.name} blocks of shape {tuple(tensor.shape)}: expected "
                         f"{k // elems * nbytes} bytes per row ({k} inputs)")
    if _is_row_parallel(layer):
        if tensor.shape[0] != layer.output_size:
            raise ValueError(f"GGUF {qtype.name} blocks of shape {tuple(tensor.shape)}: expected "
                             f"{layer.output_size} rows")
        per_rank = layer.input_size // elems
        first = layer.tp_rank * per_rank
        rank_blocks = tensor.view(tensor.shape[0], -1, nbytes)[:, first:first + per_rank]
        return 0, rank_blocks.reshape(tensor.shape[0], per_rank * nbytes)
    row0, src = _row_map(layer, shard_id, tensor.shape[0])
    if src.numel() == tensor.shape[0] and bool((src == torch.arange(src.numel())).all()):
        return row0, tensor
    return row0, tensor.index_select(0, src.to(tensor.device))


def gather_parts(layer: nn.Module, pending: dict[Any, torch.Tensor]) -> list[Part]:
    """This rank's parts of a layer, in output order, consecutive parts of one type merged."""
    pieces = []
    for shard_id, tensor in pending.items():
        row0, blocks = _rank_blocks(layer, tensor, shard_id)
        pieces.append(Part(block_qtype(tensor), row0, blocks.shape[0], blocks))
    pieces.sort(key=lambda p: p.row0)
    parts: list[Part] = []
    for p in pieces:
        last = parts[-1] if parts else None
        if last is not None and last.qtype == p.qtype and last.row0 + last.rows == p.row0:
            last.blocks = torch.cat([last.blocks, p.blocks])
            last.rows += p.rows
            last.tensors += 1
        else:
            parts.append(p)
    covered = 0
    for p in parts:
        if p.row0 != covered:
            raise ValueError(f"GGUF weights cover output rows from {p.row0}, expected {covered}")
        covered += p.rows
    if covered != layer.output_size:
        raise ValueError(f"GGUF weights cover {covered} output rows, the layer has {layer.output_size}")
    return parts


def pack(parts: list[Part]) -> torch.Tensor:
    """One uint8 tensor holding every part (each 16-byte aligned); parts become views into it."""
    offsets, total = [], 0
    for p in parts:
        offsets.append(total)
        total += -(-p.blocks.numel() // _ALIGN) * _ALIGN
    flat = torch.empty(total, dtype=torch.uint8, device=parts[0].blocks.device)
    for p, offset in zip(parts, offsets):
        view = flat[offset:offset + p.blocks.numel()].view(p.blocks.shape)
        view.copy_(p.blocks)
        p.blocks = view
    return flat


def dequantized(tensor: torch.Tensor) -> torch.Tensor:
    """A checkpoint tensor as values: GGUF blocks decoded (float32) on their device, else itself."""
    qtype = block_qtype(tensor)
    if qtype is None:
        return tensor
    elems, nbytes = block_size(qtype)
    return dequantize(tensor, qtype, (tensor.shape[0], tensor.shape[1] // nbytes * elems), name=f"{qtype.name} blocks")
