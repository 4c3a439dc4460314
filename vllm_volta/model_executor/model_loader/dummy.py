"""Random weights for ``load_format="dummy"`` (benchmarks and tests without a checkpoint)."""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta.model_executor.layers.layernorm import RMSNorm


@torch.no_grad()
def initialize_dummy_weights(model: nn.Module, low: float = -1e-3, high: float = 1e-3,
                             seed: int = 1234) -> None:
    """Fill every parameter with U(low, high), generated where it lives (no host copy).

    Like vLLM's dummy format, but norm weights are set to 1 so activations keep their scale,
    integer (packed quantized) tensors get uniformly random bits and FP8 weights U(-1, 1).
    """
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    norm_weights = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
    generators: dict[torch.device, torch.Generator] = {}
    for param in model.parameters():
        if id(param) in norm_weights:
            param.fill_(1.0)
            continue
        gen = generators.get(param.device)
        if gen is None:
            gen = generators[param.device] = torch.Generator(param.device).manual_seed(seed)
        if param.element_size() == 1 and param.is_floating_point():
            # FP8 weights (no uniform_ for them): U(-1, 1), their per-row scales set the size.
            param.copy_(torch.empty(param.shape, device=param.device).uniform_(-1.0, 1.0, generator=gen))
        elif param.is_floating_point():
            param.uniform_(low, high, generator=gen)
        else:
            param.random_(generator=gen)
