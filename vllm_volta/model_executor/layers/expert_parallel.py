"""Expert parallelism for mixture-of-experts layers (vLLM's ``--enable-expert-parallel``).

Without it, tensor parallelism slices every expert's intermediate size across the ranks. With it,
the expert-parallel group is the tensor-parallel group (EP size = TP size: there is no data
parallelism here) and each rank holds whole experts, vLLM's linear placement: with
``n`` experts over ``ep`` ranks, ``base = n // ep`` and ``rem = n % ep``; rank ``r`` holds
``base + (r < rem)`` experts starting at global id ``r * base + min(r, rem)`` (the first ``rem``
ranks take one more). Its ``expert_map`` [n] (int32) gives each global expert's local index on
this rank, -1 for experts held elsewhere.

Routing stays global (the router is replicated), every rank already holds every token after the
attention all-reduce, and each rank computes only its experts' share of each token's weighted
sum; the MoE layer's one all-reduce adds the ranks' shares (and any TP-sharded shared expert).

The setting reaches the layers as the quantization config does: model construction runs inside
``expert_parallel(enabled)``, and each MoE layer asks ``moe_placement(num_experts)`` for its
experts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers.parallel_state import (get_tensor_model_parallel_rank,
                                                             get_tensor_model_parallel_world_size)

logger = init_logger(__name__)


@dataclass(frozen=True)
class ExpertPlacement:
    """The experts one rank holds: global ids ``[start, start + num_local)`` of ``num_experts``."""

    num_experts: int
    ep_size: int
    ep_rank: int
    start: int
    num_local: int

    def local_index(self, expert: int) -> int | None:
        """The local slot of global ``expert`` on this rank, or None if another rank holds it."""
        local = expert - self.start
        return local if 0 <= local < self.num_local else None

    def expert_map(self, device: torch.device | str | None = None) -> torch.Tensor:
        """int32 [num_experts]: each global expert's local index here, -1 elsewhere."""
        out = torch.full((self.num_experts,), -1, dtype=torch.int32, device=device)
        out[self.start:self.start + self.num_local] = torch.arange(self.num_local, dtype=torch.int32,
                                                                   device=device)
        return out

    def describe(self) -> str:
        end = self.start + self.num_local
        return f"EP rank {self.ep_rank}/{self.ep_size} holds experts [{self.start}, {end}) of {self.num_experts}"


def linear_placement(num_experts: int, ep_size: int, ep_rank: int) -> ExpertPlacement:
    """vLLM's linear placement of ``num_experts`` over ``ep_size`` ranks, for rank ``ep_rank``."""
    if not isinstance(ep_size, int) or ep_size < 1:
        raise ValueError(f"expert parallel size must be an integer >= 1, got {ep_size!r}")
    if not isinstance(ep_rank, int) or not 0 <= ep_rank < ep_size:
        raise ValueError(f"expert parallel rank must be an integer in [0, {ep_size - 1}], got {ep_rank!r}")
    if num_experts < ep_size:
        raise ValueError(f"enable_expert_parallel: num_experts ({num_experts}) must be at least the expert "
                         f"parallel size (tensor_parallel_size={ep_size}), so that every rank holds an "
                         f"expert; use a tensor_parallel_size of at most {num_experts} or turn "
                         f"enable_expert_parallel off")
    base, rem = divmod(num_experts, ep_size)
    return ExpertPlacement(num_experts, ep_size, ep_rank, ep_rank * base + min(ep_rank, rem),
                           base + (1 if ep_rank < rem else 0))


@dataclass
class _Scope:
    enabled: bool
    moe_layers: int = 0


_scopes: list[_Scope] = [_Scope(False)]


@contextlib.contextmanager
def expert_parallel(enabled: bool) -> Iterator[None]:
    """MoE layers built inside the block hold whole experts when ``enabled`` (and more than one
    rank). Logs once that the flag has no effect where no MoE layer was built."""
    scope = _Scope(bool(enabled))
    _scopes.append(scope)
    try:
        yield
    finally:
        _scopes.pop()
    if scope.enabled and scope.moe_layers == 0:
        logger.info("enable_expert_parallel has no effect: the model has no mixture-of-experts layers")


def expert_parallel_enabled() -> bool:
    return _scopes[-1].enabled


def moe_placement(num_experts: int) -> ExpertPlacement | None:
    """The experts a new MoE layer holds on this rank with expert parallelism (EP = TP ranks), or
    None when every rank holds a slice of every expert (EP off, or one rank)."""
    scope = _scopes[-1]
    scope.moe_layers += 1
    size = get_tensor_model_parallel_world_size()
    if not scope.enabled:
        return None
    if size == 1:
        info_once(logger, "enable_expert_parallel with one rank: every expert is local")
        return None
    placement = linear_placement(num_experts, size, get_tensor_model_parallel_rank())
    info_once(logger, "Expert parallelism: %s per MoE layer (whole experts; the ranks' outputs are "
              "summed by the MoE all-reduce)", placement.describe())
    return placement
