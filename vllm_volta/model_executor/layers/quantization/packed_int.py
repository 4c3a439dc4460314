"""Integer weights (4 or 8 bits) with group scales, from GPTQ or compressed-tensors checkpoints.

Every format here computes W[k, n] = (q[k, n] - z[G(k), n]) * s[G(k), n], where G(k) is input row
k's group: k // group_size, 0 for one group per output channel (``group_size`` -1), or the
checkpoint's g_idx[k] (activation order). Each checkpoint tensor is converted, as it loads, into
one of two layouts held under the checkpoint's own parameter names (format.py's converters):

- "awq": 4-bit weights whose groups are contiguous rows (no g_idx) are repacked into AWQ's layout
  (awq.py), so a GPU runs them through awq_gemv (decode rows) / awq_dequantize + cuBLAS;
- "rows": everything else (8-bit, activation order) keeps q packed along K, [K * bits / 32, N],
  value 32/bits * i + j of each int32 in bits ``bits * j``; zeros unpacked [G, N]; the weight is
  dequantized by G(k) in PyTorch ops each call, then one GEMM (cuBLAS on a GPU). A 4-bit layer in
  activation order loads this way, then moves to AWQ's layout with its rows sorted by group
  where it can (act_order.py).

Tensor parallelism: a column-parallel layer takes its output columns of every tensor; a
row-parallel one its rows of q and g_idx, and its rows of the scales / zeros when its rows are
whole groups (no g_idx, group size > 0); otherwise (act order, per channel) every rank holds all
of them and its g_idx slice says which each of its rows uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vllm_volta.model_executor.layers.quantization import w4_linear
from vllm_volta.model_executor.layers.quantization.act_order import note_loaded, sorted_group_rows, to_awq_layout
from vllm_volta.model_executor.layers.quantization.awq import (PACK, awq_dense_weight, awq_matmul,
                                                               kernel_path, pack_awq)

# Converts a checkpoint tensor (role, tensor) into this layer's layout (before sharding).
Converter = Callable[[str, torch.Tensor], torch.Tensor]
# The checkpoint tensors of a layer, by role (compressed-tensors adds "shape": weight_shape).
ROLES = ("qweight", "zeros", "scales", "g_idx")


@dataclass(frozen=True)
class PackedIntConfig:
    """A checkpoint's integer weight format.

    ``names`` maps each role (qweight, zeros, scales, g_idx, and "shape" for compressed-tensors'
    weight_shape) to the checkpoint's tensor suffix; ``has_zeros`` False means symmetric weights
    without a zero tensor (zero 2**(bits - 1)); ``dense_ok``: a layer may hold a dense ``weight``
    instead (compressed-tensors' ``ignore`` list)."""

    quant_method: str
    fmt: str
    bits: int
    group_size: int
    act_order: bool
    has_zeros: bool
    names: tuple[tuple[str, str], ...]
    dense_ok: bool = False

    @property
    def layout(self) -> str:
        """The layout tensors load into (a 4-bit act-order layer may move to "awq" afterwards)."""
        return "awq" if self.bits == 4 and not self.act_order else "rows"

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits

    def name(self, role: str) -> str | None:
        return dict(self.names).get(role)

    def describe(self) -> str:
        group = "per channel" if self.group_size == -1 else f"group size {self.group_size}"
        order = ", activation order" if self.act_order else ""
        zeros = "asymmetric" if self.has_zeros else "symmetric"
        if self.layout == "awq":
            how = "repacked to AWQ's layout"
        elif self.bits == 4:
            how = ("rows sorted by group into AWQ's layout (a row-parallel rank's slice at tp > 1: "
                   "dequantized by group index in PyTorch, then one GEMM)")
        else:
            how = "dequantized by group index in PyTorch, then one GEMM (cuBLAS on a GPU)"
        return f"{self.fmt} {self.bits}-bit {zeros}, {group}{order}, {how}"

    def kernel_path(self, device: torch.device, dtype: torch.dtype) -> str:
        if self.bits == 4:
            return kernel_path(device, dtype)
        return f"PyTorch dequantization by group index + matmul ({device.type}, {dtype})"

    def get_quant_method(self) -> PackedIntLinearMethod:
        if self.dense_ok:
            from vllm_volta.model_executor.layers.quantization.dense_or_packed import DenseOrPackedMethod
            return DenseOrPackedMethod(self)
        return PackedIntLinearMethod(self)


def unpack_int(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 packed along ``dim`` (value j of each 32/bits in bits ``bits * j``) -> the unsigned
    values, 32/bits times as long along ``dim``."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)
    shifts = shifts.view([per] + [1] * (packed.dim() - dim - 1))
    values = (packed.to(torch.int32).unsqueeze(dim + 1) >> shifts) & ((1 << bits) - 1)
    return values.flatten(dim, dim + 1)


def dequantize_rows(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                    groups: torch.Tensor | None, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """W [K, N] in ``dtype`` from the "rows" layout; ``groups`` [K]: each row's group, or None
    for groups of consecutive rows (broadcast: no [K, N] copies of the zeros and scales)."""
    q = unpack_int(qweight, bits, 0)
    if groups is None:
        k, n = q.shape
        g = zeros.shape[0]
        w = (q.view(g, k // g, n) - zeros.unsqueeze(1)).to(dtype) * scales.to(dtype).unsqueeze(1)
        return w.view(k, n)
    z = zeros.index_select(0, groups)
    s = scales.to(dtype).index_select(0, groups)
    return (q - z).to(dtype) * s


def _converter(config: PackedIntConfig) -> Converter:
    """The checkpoint format's tensor converter (gptq.py, compressed_tensors.py)."""
    if config.quant_method == "gptq":
        from vllm_volta.model_executor.layers.quantization.gptq import gptq_converter
        return gptq_converter(config)
    from vllm_volta.model_executor.layers.quantization.compressed_tensors import ct_converter
    return ct_converter(config)


def _is_row_parallel(layer: nn.Module) -> bool:
    from vllm_volta.model_executor.layers.linear import RowParallelLinear

    return isinstance(layer, RowParallelLinear)


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class PackedIntLinearMethod:
    """Creates a linear layer's integer-weight tensors (under the checkpoint's names) and computes
    x W with them."""

    def __init__(self, config: PackedIntConfig) -> None:
        self.config = config
        self.convert: Converter = _converter(config)

    def _groups(self, layer: nn.Module, input_size: int) -> tuple[int, bool]:
        """(scale / zero rows this rank holds, whether they are every rank's full set)."""
        g, tp = self.config.group_size, getattr(layer, "tp_size", 1)
        if g == -1:
            return 1, True
        if self.config.act_order:  # g_idx names the group: the last may be short
            if _is_row_parallel(layer) and tp > 1:
                return -(-input_size * tp // g), True
            return -(-input_size // g), False
        if input_size % g:
            raise ValueError(f"quantized layer with {input_size} inputs (this rank's part): the input size "
                             f"must be a multiple of the group size {g}")
        return input_size // g, False

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype | None) -> None:
        cfg, pf = self.config, self.config.pack_factor
        if input_size % pf or output_size % PACK:
            raise ValueError(f"quantized layer {input_size} -> {output_size} (this rank's part): the input "
                             f"size must be a multiple of {pf} and the output size of {PACK}")
        groups, replicated = self._groups(layer, input_size)
        int32, fdtype = torch.int32, params_dtype or torch.get_default_dtype()
        if cfg.layout == "awq":
            shapes = {"qweight": ((input_size, output_size // PACK), int32, PACK),
                      "zeros": ((groups, output_size // PACK), int32, PACK)}
        else:
            shapes = {"qweight": ((input_size // pf, output_size), int32, 1),
                      "zeros": ((groups, output_size), int32, 1)}
        shapes["scales"] = ((groups, output_size), fdtype, 1)
        if cfg.act_order:
            shapes["g_idx"] = ((input_size,), int32, 1)
        layer.quant_group_size = input_size if cfg.group_size == -1 else cfg.group_size
        for role, (shape, dtype, pack) in shapes.items():
            name = cfg.name(role)
            if role == "zeros" and not cfg.has_zeros:  # symmetric: the mid-point, held as a buffer
                mid = torch.full((groups, output_size), 1 << (cfg.bits - 1), dtype=int32)
                layer.register_buffer("quant_zeros", pack_awq(mid) if cfg.layout == "awq" else mid,
                                      persistent=False)
                continue
            param = _param(shape, dtype)
            setattr(layer, name, param)
            param.output_dim, param.input_dim, param.pack = 1, 0, pack
            param.weight_loader = self._loader(layer, role, replicated)
        if cfg.name("shape") is not None:
            param = _param((2,), torch.int64)
            setattr(layer, cfg.name("shape"), param)
            param.weight_loader = self._shape_loader(layer, input_size)

    def _loader(self, layer: nn.Module, role: str, replicated: bool) -> Callable[..., None]:
        """The loader of one role: convert the checkpoint tensor, then shard it like the layer."""
        convert = self.convert

        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            tensor = convert(role, loaded)
            if role == "g_idx":
                _load_g_idx(layer, param, tensor, getattr(layer, self.config.name("scales")).shape[0])
            elif replicated and role in ("zeros", "scales") and _is_row_parallel(layer):
                from vllm_volta.model_executor.layers.linear import copy_weight
                copy_weight(param.data, tensor)  # a row-parallel rank keeps every group's row
            else:
                layer.weight_loader(param, tensor, *shard)
            roles = tuple(r for r in ROLES if (r != "zeros" or self.config.has_zeros)
                          and (r != "g_idx" or self.config.act_order))
            if self.config.act_order and self.config.bits == 4:
                note_loaded(layer, role, shard, roles, self._sort_rows_into_awq)
            if self.config.bits == 4:  # then into the W4A16 kernels' layout (w4_linear.py)
                w4_linear.note_loaded(layer, role, shard, roles, lambda: self._repack_w4(layer))
        return load

    def _repack_w4(self, layer: nn.Module) -> None:
        if self.config.layout == "awq" or self._awq_layout(layer):
            w4_linear.repack_layer(layer, *self.tensors(layer), layer.quant_group_size)

    def _sort_rows_into_awq(self, layer: nn.Module) -> None:
        """A loaded 4-bit act-order layer: into AWQ's layout, rows sorted by group, when its
        groups are whole (act_order.py); else it stays in the "rows" layout."""
        cfg = self.config
        qweight, zeros, scales = self.tensors(layer)
        perm = sorted_group_rows(getattr(layer, cfg.name("g_idx")), scales.shape[0], layer.quant_group_size)
        if perm is None:
            return
        qweight.data, packed_zeros = to_awq_layout(unpack_int(qweight, 4, 0), zeros, perm)
        if cfg.has_zeros:
            zeros.data = packed_zeros
        else:
            layer.quant_zeros = packed_zeros
        layer.register_buffer("quant_perm", perm, persistent=False)

    @staticmethod
    def _shape_loader(layer: nn.Module, input_size: int) -> Callable[..., None]:
        """compressed-tensors' weight_shape [N, K]: checked against the layer's input size."""
        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            total = input_size * (layer.tp_size if _is_row_parallel(layer) else 1)
            if loaded.numel() != 2 or int(loaded[1]) != total:
                raise ValueError(f"weight_shape {loaded.tolist()} does not match the layer's {total} inputs")
            param.data.copy_(loaded.to(param.dtype))
        return load

    def tensors(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qweight, zeros, scales) in this config's layout."""
        cfg = self.config
        zeros = getattr(layer, cfg.name("zeros")) if cfg.has_zeros else layer.quant_zeros
        return getattr(layer, cfg.name("qweight")), zeros, getattr(layer, cfg.name("scales"))

    def _row_groups(self, layer: nn.Module) -> torch.Tensor | None:
        """Each row's group from g_idx (activation order); None: consecutive rows of a group."""
        cfg = self.config
        if not cfg.act_order:
            return None
        scales = getattr(layer, cfg.name("scales"))  # modulo: dummy-initialised weights hold random bits
        return getattr(layer, cfg.name("g_idx")).long().remainder(scales.shape[0])

    @staticmethod
    def _awq_layout(layer: nn.Module) -> bool:
        return getattr(layer, "quant_perm", None) is not None

    def dense_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """W [K, N] in ``dtype``."""
        qweight, zeros, scales = self.tensors(layer)
        if self.config.layout == "awq":
            return awq_dense_weight(qweight, zeros, scales, layer.quant_group_size, dtype, layer)
        if self._awq_layout(layer):  # rows sorted by group: put them back
            sorted_w = awq_dense_weight(qweight, zeros, scales, layer.quant_group_size, dtype, layer)
            return torch.empty_like(sorted_w).index_copy_(0, layer.quant_perm, sorted_w)
        return dequantize_rows(qweight, zeros, scales, self._row_groups(layer), self.config.bits, dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] -> x W + bias [..., N]."""
        if self.config.layout == "awq" or self._awq_layout(layer):
            qweight, zeros, scales = self.tensors(layer)
            if self._awq_layout(layer):
                x = x.index_select(-1, layer.quant_perm)
            return awq_matmul(x, qweight, zeros, scales, layer.quant_group_size, bias, layer)
        out = x.reshape(-1, x.shape[-1]) @ self.dense_weight(layer, x.dtype)
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], out.shape[-1])


def _load_g_idx(layer: nn.Module, param: nn.Parameter, g_idx: torch.Tensor, groups: int) -> None:
    """This rank's rows of g_idx (each in [0, ``groups``)). Fused projections (q/k/v, gate/up)
    share their input, so GPTQ orders their rows alike: every shard's g_idx must be the same."""
    from vllm_volta.model_executor.layers.linear import copy_weight, take_shard

    if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
        raise ValueError(f"g_idx holds groups {int(g_idx.min())}..{int(g_idx.max())}, outside 0..{groups - 1}")
    rows = param.shape[0]
    if _is_row_parallel(layer):
        g_idx = take_shard(g_idx, 0, layer.tp_rank, rows, rows * layer.tp_size)
    if getattr(param, "loaded_once", False):
        if not torch.equal(param.data.cpu(), g_idx.to(param.dtype).cpu()):
            raise ValueError("g_idx differs between the projections fused into one layer (q/k/v or "
                             "gate/up); only a shared activation order is supported")
        return
    copy_weight(param.data, g_idx)
    param.loaded_once = True
