"""Tensor-parallel rank/size seen by the layers, and the collectives they need.

Defaults to a single rank (tp_size = 1), where the collectives are no-ops. A tensor-parallel
executor calls ``set_tensor_parallel(rank, size)`` in each worker (after
``torch.distributed.init_process_group``) before building the model; the layers then hold only
their shard and the weight loaders cut the checkpoint tensors accordingly.
"""

from __future__ import annotations

import torch

_tp_rank = 0
_tp_size = 1


def set_tensor_parallel(rank: int, size: int) -> None:
    """Set this process's tensor-parallel rank and world size."""
    global _tp_rank, _tp_size
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor parallel size must be an integer >= 1, got {size!r}")
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"tensor parallel rank must be an integer in [0, {size - 1}], got {rank!r}")
    _tp_rank, _tp_size = rank, size


def get_tensor_model_parallel_rank() -> int:
    return _tp_rank


def get_tensor_model_parallel_world_size() -> int:
    return _tp_size


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator / denominator``, which must be exact (e.g. heads split across ranks)."""
    if numerator % denominator != 0:
        raise ValueError(f"{what} ({numerator}) must be divisible by the tensor parallel size "
                         f"({denominator})")
    return numerator // denominator


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel ranks (in place)."""
    if _tp_size == 1:
        return x
    import torch.distributed as dist
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    if _tp_size == 1:
        return x
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(_tp_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)


def tensor_model_parallel_broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Give every rank rank ``src``'s ``x`` (in place; enqueued on the device like the others)."""
    if _tp_size == 1:
        return x
    import torch.distributed as dist
    dist.broadcast(x, src)
    return x
