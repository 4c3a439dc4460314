"""Linear layers with vLLM's names and weight-loader pattern.

Each parameter carries a ``weight_loader(param, loaded_weight[, shard_id])`` that cuts this rank's
shard out of the full checkpoint tensor, so models load HF names the same way at any tensor
parallel size. ``forward`` returns the output tensor (vLLM also returns an unused bias slot).

A layer built under ``quantization(config)`` (layers/quantization) holds that method's tensors
(AWQ: qweight, qzeros, scales) instead of ``weight``; each parameter says which of its dims is the
output (``output_dim``, packed ``pack`` values per element) and which the input (``input_dim``),
so the same loaders shard dense and packed tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from vllm_volta.model_executor.layers.decode_gemv import add_linear_, gemv_enabled, linear
from vllm_volta.model_executor.layers.parallel_state import (
    divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce)
from vllm_volta.model_executor.layers.quantization import current_quant_config

if TYPE_CHECKING:
    from vllm_volta.model_executor.layers.layernorm import RMSNorm


def copy_weight(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` (casting dtype/device) after checking the shapes agree."""
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(src.shape)}, "
                         f"expected {tuple(dst.shape)}")
    dst.copy_(src)


def take_shard(loaded_weight: torch.Tensor, dim: int, index: int, size: int,
               total: int) -> torch.Tensor:
    """Slice ``index`` (of length ``size``) along ``dim`` of a checkpoint tensor whose ``dim``
    must be ``total`` long."""
    if loaded_weight.dim() <= dim or loaded_weight.shape[dim] != total:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                         f"expected size {total} in dimension {dim}")
    return loaded_weight.narrow(dim, index * size, size)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Load a replicated (unsharded) parameter."""
    copy_weight(param.data, loaded_weight)


def _new_param(*shape: int, dtype: torch.dtype | None) -> nn.Parameter:
    # Uninitialised: every parameter is filled by a loader (checkpoint or dummy).
    return nn.Parameter(torch.empty(*shape, dtype=dtype or torch.get_default_dtype()),
                        requires_grad=False)


def _output_axis(param: nn.Parameter) -> tuple[int, int]:
    """(the dim of ``param`` along output features, output features per element along it)."""
    return getattr(param, "output_dim", 0), getattr(param, "pack", 1)


class LinearBase(nn.Module):
    """y = x W^T + b with W of shape [output_size, input_size] (this rank's part)."""

    def __init__(self, input_size: int, output_size: int, bias: bool,
                 params_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        quant_config = current_quant_config()
        self.quant_method = None if quant_config is None else quant_config.get_quant_method()
        if self.quant_method is None:
            self.weight = _new_param(output_size, input_size, dtype=params_dtype)
            self.weight.weight_loader = self.weight_loader
        else:
            self.quant_method.create_weights(self, input_size, output_size, params_dtype)
        if bias:
            self.bias = _new_param(output_size, dtype=params_dtype)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        # decode-sized float16 inputs on CUDA (decode_gemv.py); quantized layers have their own
        self.use_gemv = gemv_enabled() and self.quant_method is None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        default_weight_loader(param, loaded_weight)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None, norm: RMSNorm | None = None) -> torch.Tensor:
        """x W^T + bias; with `norm`, of norm(x) (fused into gemv at decode sizes)."""
        if self.quant_method is not None:
            return self.quant_method.apply(self, x if norm is None else norm(x), bias)
        return linear(x, self.weight, bias, self.use_gemv, norm)

    def forward(self, x: torch.Tensor, norm: RMSNorm | None = None) -> torch.Tensor:
        """x W^T + b; with `norm`, of norm(x)."""
        return self.matmul(x, self.bias, norm)

    def extra_repr(self) -> str:
        quant = "" if self.quant_method is None else f", {self.quant_method.config.describe()}"
        return (f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, "
                f"tp_size={self.tp_size}{quant}")


class ReplicatedLinear(LinearBase):
    """A linear layer every rank holds in full."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 params_dtype: torch.dtype | None = None) -> None:
        super().__init__(input_size, output_size, bias, params_dtype)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks (rank r holds rows [r*n, (r+1)*n) of W)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 gather_output: bool = False, params_dtype: torch.dtype | None = None) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        super().__init__(input_size, divide(output_size, tp_size, "output_size"), bias,
                         params_dtype)
        self.total_output_size = output_size
        self.gather_output = gather_output

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        dim, _ = _output_axis(param)
        size = param.shape[dim]
        copy_weight(param.data, take_shard(loaded_weight, dim, self.tp_rank, size,
                                           size * self.tp_size))

    def forward(self, x: torch.Tensor, norm: RMSNorm | None = None) -> torch.Tensor:
        out = super().forward(x, norm)
        return tensor_model_parallel_all_gather(out) if self.gather_output else out


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul
    (e.g. gate_proj and up_proj -> gate_up_proj); checkpoint shard ``i`` is ``output_sizes[i]``."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 gather_output: bool = False, params_dtype: torch.dtype | None = None) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(self.output_sizes), bias, gather_output, params_dtype)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: int | None = None) -> None:
        dim, pack = _output_axis(param)
        if loaded_shard_id is None:  # an already-fused checkpoint tensor: split it first
            offset = 0
            for shard_id, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded_weight.narrow(dim, offset // pack, size // pack), shard_id)
                offset += size
            return
        if not 0 <= loaded_shard_id < len(self.output_sizes):
            raise ValueError(f"loaded_shard_id must be in [0, {len(self.output_sizes) - 1}], "
                             f"got {loaded_shard_id}")
        size = self.output_sizes[loaded_shard_id] // self.tp_size // pack
        offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size // pack
        copy_weight(param.data.narrow(dim, offset, size),
                    take_shard(loaded_weight, dim, self.tp_rank, size,
                               self.output_sizes[loaded_shard_id] // pack))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused into one matmul; heads split across ranks.

    When there are fewer kv heads than ranks, each kv head is replicated on
    ``tp_size // total_num_kv_heads`` ranks.
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int | None = None, bias: bool = False,
                 params_dtype: torch.dtype | None = None) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size, "num_attention_heads")
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, total_num_kv_heads, "tp size / kv heads")
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, "num_key_value_heads")
            self.num_kv_head_replicas = 1
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        total_out = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, total_out, bias, False, params_dtype)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | None = None) -> None:
        dim, pack = _output_axis(param)
        if loaded_shard_id is None:  # fused qkv checkpoint tensor
            sizes = {"q": self.total_num_heads * self.head_size,
                     "k": self.total_num_kv_heads * self.head_size,
                     "v": self.total_num_kv_heads * self.head_size}
            offset = 0
            for shard_id, size in sizes.items():
                self.weight_loader(param, loaded_weight.narrow(dim, offset // pack, size // pack), shard_id)
                offset += size
            return
        if loaded_shard_id == "q":
            offset, size, shard_rank = 0, self.q_size, self.tp_rank
            total = self.total_num_heads * self.head_size
        elif loaded_shard_id in ("k", "v"):
            offset = self.q_size + (self.kv_size if loaded_shard_id == "v" else 0)
            size, shard_rank = self.kv_size, self.tp_rank // self.num_kv_head_replicas
            total = self.total_num_kv_heads * self.head_size
        else:
            raise ValueError(f"loaded_shard_id must be 'q', 'k' or 'v', got {loaded_shard_id!r}")
        copy_weight(param.data.narrow(dim, offset // pack, size // pack),
                    take_shard(loaded_weight, dim, shard_rank, size // pack, total // pack))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed (all-reduce), then the bias
    (held in full by every rank) is added once."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 reduce_results: bool = True, params_dtype: torch.dtype | None = None) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        super().__init__(divide(input_size, tp_size, "input_size"), output_size, bias,
                         params_dtype)
        self.total_input_size = input_size
        self.reduce_results = reduce_results
        if bias:
            self.bias.weight_loader = default_weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        dim = getattr(param, "input_dim", 1)
        size = param.shape[dim]
        copy_weight(param.data, take_shard(loaded_weight, dim, self.tp_rank, size,
                                           size * self.tp_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.matmul(x, self.bias)
        out = self.matmul(x, None)
        if self.reduce_results:
            out = tensor_model_parallel_all_reduce(out)
        return out + self.bias if self.bias is not None else out

    def add_into_(self, residual: torch.Tensor, x: torch.Tensor) -> bool:
        """``residual += self(x)`` in one kernel on one rank (decode_gemv.add_linear_: gemv_add,
        or the GEMM accumulating into the residual); returns False, with nothing done, when that
        does not apply (then call ``forward``)."""
        return (self.tp_size == 1 and self.quant_method is None
                and add_linear_(residual, x, self.weight, self.bias, self.use_gemv))
