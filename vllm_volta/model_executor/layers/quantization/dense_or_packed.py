"""Linear layers of a checkpoint that quantizes only some of them (compressed-tensors' ``ignore``
list and ``targets``, AWQ's ``modules_to_not_convert``): the checkpoint decides, per layer, as its
tensors load.

Each layer starts with the packed tensors of its config and an empty ``weight``. The first
tensor that loads fixes the layer: a dense ``weight`` allocates the full float weight and drops
the packed tensors; a packed tensor drops the empty ``weight``. Either way the parameters left are
exactly the ones the checkpoint must fill, so a missing tensor is still reported, and only dense
layers pay for float weights. The projections fused into one layer (q/k/v, gate/up) must agree.
A dense layer never reaches the packed method's loaders, so it is never repacked (w4_linear.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vllm_volta.model_executor.layers.quantization.awq import AWQLinearMethod
from vllm_volta.model_executor.layers.quantization.packed_int import PackedIntLinearMethod

_DENSE, _PACKED = "dense", "packed"


class DenseOrPacked:
    """Mixed in before a packed linear method (its ``create_weights``, ``dense_weight`` and
    ``apply`` serve packed layers) for layers that may turn out dense (``layer.quant_kind``)."""

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype | None) -> None:
        super().create_weights(layer, input_size, output_size, params_dtype)
        packed = [name for name, _ in layer.named_parameters(recurse=False)]
        for name in packed:
            param = getattr(layer, name)
            param.weight_loader = self._choosing(layer, _PACKED, param.weight_loader, packed)
        layer.quant_kind = None
        layer.dense_shape = (output_size, input_size)
        layer.dense_dtype = params_dtype or torch.get_default_dtype()
        layer.weight = nn.Parameter(torch.empty(0, dtype=layer.dense_dtype), requires_grad=False)
        layer.weight.weight_loader = self._choosing(layer, _DENSE, self._load_dense(layer), packed)

    @staticmethod
    def _load_dense(layer: nn.Module) -> Callable[..., None]:
        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            layer.weight_loader(layer.weight, loaded, *shard)  # the allocated weight, not the placeholder
        return load

    @staticmethod
    def _choosing(layer: nn.Module, kind: str, load: Callable[..., None], packed: list[str]) -> Callable[..., None]:
        """``load`` after fixing the layer's kind on its first tensor."""
        def choose_then_load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            if layer.quant_kind is None:
                layer.quant_kind = kind
                if kind == _DENSE:
                    for name in packed:
                        delattr(layer, name)
                    if hasattr(layer, "quant_zeros"):
                        del layer.quant_zeros
                    device = layer.weight.device
                    weight = nn.Parameter(torch.empty(*layer.dense_shape, dtype=layer.dense_dtype, device=device),
                                          requires_grad=False)
                    weight.weight_loader = layer.weight.weight_loader
                    layer.weight = weight
                else:
                    del layer.weight
            elif layer.quant_kind != kind:
                raise ValueError(f"this layer's tensors are both {layer.quant_kind} and {kind}: the "
                                 "projections fused into one layer (q/k/v, gate/up) must all be "
                                 "quantized or all be listed in the checkpoint's ignore list / "
                                 "modules_to_not_convert")
            load(param, loaded, *shard)
        return choose_then_load

    def dense_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        if layer.quant_kind == _DENSE:
            return layer.weight.t().to(dtype)
        return super().dense_weight(layer, dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if layer.quant_kind == _DENSE:
            return F.linear(x, layer.weight, bias)
        return super().apply(layer, x, bias)


class DenseOrPackedMethod(DenseOrPacked, PackedIntLinearMethod):
    """GPTQ / compressed-tensors integer layers that may be dense (the ``ignore`` list)."""


class AWQDenseOrPackedMethod(DenseOrPacked, AWQLinearMethod):
    """AWQ layers that may be dense (``modules_to_not_convert``)."""
