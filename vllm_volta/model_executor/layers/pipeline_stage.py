"""A model's share of a pipeline: its decoder layers, and the activations in and out.

Every model builds its decoder through ``PipelineStage``: stage ``pp_rank`` builds only layers
[start, end) (pp_partition.py) and a ``PPMissingLayer`` (no parameters) in the other slots, so
layer indices and checkpoint names stay global. The first stage holds the embeddings, the last
the final norm and LM head (and the embeddings too when the head is tied to them).

Between stages the residual stream travels as it is between two layers, ``(hidden_states,
residual)``, stacked in one [2, tokens, hidden] tensor: stage k sends it to the same TP rank of
stage k + 1 on the PP group (torch.distributed isend/recv: gloo on CPUs, NCCL on GPUs). A layer
that already added its output into the residual returns ``hidden_states=None``; zeros go in its
place, which the next stage's fused add leaves exact. Every stage runs the same scheduled steps
in the same order, so stage k + 1 knows the token count of what it receives.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from vllm_volta.model_executor.layers.parallel_state import (get_pipeline_model_parallel_rank,
                                                             get_pipeline_model_parallel_world_size,
                                                             get_pp_group)
from vllm_volta.model_executor.layers.pp_partition import get_pp_indices


class PPMissingLayer(nn.Module):
    """Stands in for a module another pipeline stage holds: no parameters, never called."""

    def forward(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("this module lives on another pipeline stage (PPMissingLayer)")


def is_pp_missing(model: nn.Module, name: str) -> bool:
    """Whether the parameter or module ``name`` of ``model`` is held by another stage."""
    module: nn.Module | None = model
    for part in name.split("."):
        if isinstance(module, PPMissingLayer):
            return True
        module = module._modules.get(part)
        if module is None:
            return False
    return isinstance(module, PPMissingLayer)


class PipelineStage:
    """This process's stage of a model of ``num_layers`` decoder layers of width
    ``hidden_size``; ``dtype``: the residual stream's dtype (what travels between stages)."""

    def __init__(self, num_layers: int, hidden_size: int, dtype: torch.dtype | None = None) -> None:
        self.rank = get_pipeline_model_parallel_rank()
        self.size = get_pipeline_model_parallel_world_size()
        self.start, self.end = get_pp_indices(num_layers, self.rank, self.size)
        self.is_first, self.is_last = self.rank == 0, self.rank == self.size - 1
        self.hidden_size = hidden_size
        self.dtype = dtype or torch.get_default_dtype()
        self._sends: list[tuple[object, torch.Tensor]] = []  # isends in flight, with their buffers

    def make_layers(self, num_layers: int, build: Callable[[int], nn.Module]) -> nn.ModuleList:
        """``build(i)`` for this stage's layers, a PPMissingLayer for the others'."""
        return nn.ModuleList(build(i) if self.start <= i < self.end else PPMissingLayer()
                             for i in range(num_layers))

    def here(self, build: Callable[[], nn.Module], on_first: bool = False, on_last: bool = False
             ) -> nn.Module:
        """``build()`` where this stage holds the module (first / last stage), else a placeholder."""
        return build() if (on_first and self.is_first) or (on_last and self.is_last) else PPMissingLayer()

    def layers(self, layers: nn.ModuleList) -> Iterator[nn.Module]:
        """This stage's layers, in order (zip with the stage's kv_caches)."""
        return iter(layers[self.start:self.end])

    def check_caches(self, kv_caches: list) -> None:
        n = self.end - self.start
        if len(kv_caches) != n:
            raise ValueError(f"kv_caches must hold one cache per layer of this stage ({n}), got {len(kv_caches)}")

    def receive(self, num_tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden_states, residual) from the previous stage."""
        import torch.distributed as dist
        buf = torch.empty((2, num_tokens, self.hidden_size), dtype=self.dtype, device=device)
        dist.recv(buf, group=get_pp_group(), group_src=self.rank - 1)
        return buf[0], buf[1]

    def send(self, hidden_states: torch.Tensor | None, residual: torch.Tensor) -> None:
        """Hand the residual stream to the next stage without waiting for it to take it."""
        import torch.distributed as dist
        self._sends = [(w, t) for w, t in self._sends if not w.is_completed()]
        if hidden_states is None:
            hidden_states = torch.zeros_like(residual)
        buf = torch.stack([hidden_states.to(self.dtype), residual.to(self.dtype)])
        work = dist.isend(buf, group=get_pp_group(), group_dst=self.rank + 1)
        self._sends.append((work, buf))
