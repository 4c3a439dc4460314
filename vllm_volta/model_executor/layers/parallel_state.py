"""Tensor- and pipeline-parallel ranks seen by the layers, and the collectives they need.

Defaults to a single rank (tp_size = pp_size = 1), where the collectives are no-ops. A
tensor-parallel executor calls ``set_tensor_parallel(rank, size)`` in each worker (after
``torch.distributed.init_process_group``) before building the model; the layers then hold only
their shard and the weight loaders cut the checkpoint tensors accordingly.

With pipeline parallelism the executor calls ``init_model_parallel(tp_size, pp_size)`` instead:
global rank = pp_rank * tp_size + tp_rank (vLLM's order), the TP collectives run on the stage's
TP group, and the stages exchange activations on their PP group (pipeline_comm.py).
"""

from __future__ import annotations

import torch

_tp_rank = 0
_tp_size = 1
_pp_rank = 0
_pp_size = 1
_tp_group = None  # torch.distributed group of this stage's TP ranks (None: the world group)
_pp_group = None  # this TP rank's ranks across the stages


def set_tensor_parallel(rank: int, size: int) -> None:
    """Set this process's tensor-parallel rank and world size."""
    global _tp_rank, _tp_size
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor parallel size must be an integer >= 1, got {size!r}")
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"tensor parallel rank must be an integer in [0, {size - 1}], got {rank!r}")
    _tp_rank, _tp_size = rank, size


def init_model_parallel(tp_size: int, pp_size: int) -> None:
    """Make the TP and PP groups (every rank calls this, in the same order) and set this rank's
    TP/PP coordinates from its global rank: pp_rank = rank // tp_size, tp_rank = rank % tp_size."""
    global _pp_rank, _pp_size, _tp_group, _pp_group
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    if tp_size * pp_size != world:
        raise ValueError(f"tensor_parallel_size ({tp_size}) x pipeline_parallel_size ({pp_size}) must "
                         f"equal the world size ({world})")
    for stage in range(pp_size):  # new_group is collective: every rank makes every group
        group = dist.new_group(list(range(stage * tp_size, (stage + 1) * tp_size)))
        if stage == rank // tp_size:
            _tp_group = group
    for tp_rank in range(tp_size):
        group = dist.new_group(list(range(tp_rank, world, tp_size)))
        if tp_rank == rank % tp_size:
            _pp_group = group
    set_tensor_parallel(rank % tp_size, tp_size)
    _pp_rank, _pp_size = rank // tp_size, pp_size


def destroy_model_parallel() -> None:
    """Back to one rank (the groups die with the default process group)."""
    global _pp_rank, _pp_size, _tp_group, _pp_group
    set_tensor_parallel(0, 1)
    _pp_rank, _pp_size, _tp_group, _pp_group = 0, 1, None, None


def get_pipeline_model_parallel_rank() -> int:
    return _pp_rank


def get_pipeline_model_parallel_world_size() -> int:
    return _pp_size


def get_pp_group() -> object | None:
    """This TP rank's group across the pipeline stages (None without pipeline parallelism)."""
    return _pp_group


def get_tp_group() -> object | None:
    """This stage's TP group (None: the default group, which is the TP group without PP)."""
    return _tp_group


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
    dist.all_reduce(x, group=_tp_group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    if _tp_size == 1:
        return x
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(_tp_size)]
    dist.all_gather(parts, x.contiguous(), group=_tp_group)
    return torch.cat(parts, dim=dim)


def tensor_model_parallel_broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Give every TP rank TP rank ``src``'s ``x`` (in place; enqueued on the device like the others)."""
    if _tp_size == 1:
        return x
    import torch.distributed as dist
    dist.broadcast(x, group=_tp_group, group_src=src)
    return x
