"""FP8 linear layers (fp8_config.py's formats): the weight stays float8_e4m3fn, one byte a value.

Each layer holds ``weight`` fp8 [N, K] and its scales under the checkpoint's name
(``weight_scale_inv`` / ``weight_scale``) as float32 [N, G]: one row per output feature, G =
ceil(K / bk) groups of bk inputs for block scales, G = 1 for per-channel / per-tensor. The
checkpoint's block scales [ceil(N / bn), G] are expanded to rows as they load (and a per-tensor
scale to every row of its projection), so tensor-parallel shards and fused q/k/v or gate/up
layers slice the scales exactly as they slice the weight, wherever the shard boundary falls in a
block. A row-parallel rank's inputs must be whole K blocks (else a clear error at build time).

x W^T runs one of three paths (``fp8_kernel_path``):
- W8A8 on GPUs with FP8 tensor cores (SM89+), checkpoints with FP8 activations: Triton GEMM
  (fp8_kernels.py), x quantized per token and 128-wide group (bk for block checkpoints); a
  checkpoint's static ``input_scale`` loads (the fused projections' maximum) but the dynamic
  per-group scales, finer than one per tensor, are used;
- other CUDA GPUs (V100 / T4 / A100) and weight-only checkpoints, in float16 (or bfloat16 on
  SM80+): W8A16 CUDA kernels that keep the weight in FP8 and convert it in registers (fp8_sm70.py);
- elsewhere (the CPU, bfloat16 below SM80, shapes the kernels do not take): W = weight * scales in the
  activation dtype each call, then one GEMM (cuBLAS / the CPU's).
A layer whose checkpoint ``weight`` is float (the ignore lists) becomes a dense layer as it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers.quantization import fp8_sm70
from vllm_volta.model_executor.layers.quantization.fp8_config import Fp8Config
from vllm_volta.model_executor.layers.quantization.fp8_sm70 import sm70_kernels_reason

logger = init_logger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
_W8A8_MIN_CAPABILITY = 89  # FP8 tensor cores: Ada (SM89) and Hopper (SM90) onwards
_DENSE, _FP8 = "dense", "fp8"


def _w8a8_reason(config: Fp8Config, device: torch.device) -> str | None:
    """None when the Triton W8A8 GEMM serves layers on ``device``, else why not."""
    if not config.w8a8:
        return "the checkpoint is weight-only FP8 (no activation quantization)"
    if config.block_shape and config.block_shape[1] % 32:
        return f"K blocks of {config.block_shape[1]} are not whole 32-wide FP8 GEMM tiles"
    if device.type != "cuda":
        return f"the Triton FP8 GEMM needs a CUDA GPU (here {device.type})"
    from vllm_volta.platforms import current_platform

    if not current_platform.has_device_capability(_W8A8_MIN_CAPABILITY, device.index or 0):
        cap = current_platform.get_device_capability(device.index or 0)
        return f"SM{cap.to_int() if cap else '?'} has no FP8 tensor cores (SM89+)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def fp8_kernel_path(config: Fp8Config, device: torch.device, dtype: torch.dtype) -> str:
    """Which code computes x W^T for ``config``'s layers on ``device`` in ``dtype``, and why."""
    why_not = _w8a8_reason(config, device)
    if why_not is None:
        group = config.block_shape[1] if config.block_shape else 128
        gemm = (f"W8A8 Triton FP8 GEMM (activations quantized per token and {group}-wide group, "
                "tuned configs by vLLM's file names)")
        if sm70_kernels_reason(device, dtype) is None:
            return f"fp8_gemv (W8A16) for steps of up to {fp8_sm70.GEMV_MAX_ROWS} rows, the {gemm} above"
        return gemm
    sm70_why_not = sm70_kernels_reason(device, dtype)
    if sm70_why_not is None:
        return f"{fp8_sm70.describe()} ({why_not})"
    gemm = "cuBLAS" if device.type == "cuda" else "the CPU GEMM"
    reasons = why_not if device.type != "cuda" else f"{why_not}; {sm70_why_not}"
    return f"weight-only FP8: dequantized to {str(dtype).removeprefix('torch.')} each call, then {gemm} ({reasons})"


def _checkpoint_rows(layer: nn.Module, shard: Any) -> int:
    """Output rows of the checkpoint tensor a loader gets for ``shard`` (before tensor parallelism)."""
    if hasattr(layer, "output_sizes"):  # gate/up
        return sum(layer.output_sizes) if shard is None else layer.output_sizes[shard]
    if hasattr(layer, "q_size"):  # q/k/v
        heads = {None: layer.total_num_heads + 2 * layer.total_num_kv_heads, "q": layer.total_num_heads,
                 "k": layer.total_num_kv_heads, "v": layer.total_num_kv_heads}.get(shard)
        if heads is None:
            raise ValueError(f"loaded_shard_id must be 'q', 'k' or 'v', got {shard!r}")
        return heads * layer.head_size
    return getattr(layer, "total_output_size", layer.output_size)


def _is_row_parallel(layer: nn.Module) -> bool:
    from vllm_volta.model_executor.layers.linear import RowParallelLinear

    return isinstance(layer, RowParallelLinear)


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Fp8LinearMethod:
    """Creates a linear layer's FP8 tensors and computes x W^T with them."""

    def __init__(self, config: Fp8Config) -> None:
        self.config = config
        self._paths: dict[torch.device, bool] = {}  # device -> Triton W8A8 GEMM or not
        self._sm70: dict[tuple[torch.device, torch.dtype], bool] = {}  # -> the SM70 FP8 kernels or not

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype | None) -> None:
        cfg = self.config
        group_k = cfg.block_shape[1] if cfg.strategy == "block" else input_size
        if cfg.strategy == "block" and _is_row_parallel(layer) and layer.tp_size > 1 and input_size % group_k:
            raise ValueError(
                f"FP8 block scales: a row-parallel layer's {input_size * layer.tp_size} inputs split over "
                f"tensor parallel size {layer.tp_size} give each rank {input_size}, which is not a whole number "
                f"of {group_k}-wide blocks (weight_block_size); use a tensor parallel size that divides "
                f"{-(-input_size * layer.tp_size // group_k)}")
        layer.quant_kind = None
        layer.fp8_group_k = group_k
        layer.dense_dtype = params_dtype or torch.get_default_dtype()
        layer.weight = _param(output_size, input_size, dtype=FP8_DTYPE)
        layer.weight.output_dim, layer.weight.input_dim = 0, 1
        scale = _param(output_size, -(-input_size // group_k), dtype=torch.float32)
        scale.output_dim, scale.input_dim = 0, 1
        setattr(layer, cfg.scale_name, scale)
        layer.weight.weight_loader = self._weight_loader(layer)
        scale.weight_loader = self._choosing(layer, _FP8, self._scale_loader(layer))
        if cfg.act_quant == "static":
            layer.input_scale = _param(1, dtype=torch.float32)
            layer.input_scale.weight_loader = self._choosing(layer, _FP8, self._input_scale_loader(layer))
        device = torch.get_default_device()
        info_once(logger, "FP8 linear layers (%s) on %s: %s", cfg.describe(), device,
                  fp8_kernel_path(cfg, device, layer.dense_dtype))

    # --- loading -----------------------------------------------------------------------------

    def _quant_params(self, layer: nn.Module) -> list[str]:
        return [self.config.scale_name] + (["input_scale"] if self.config.act_quant == "static" else [])

    def _choosing(self, layer: nn.Module, kind: str, load: Callable[..., None]) -> Callable[..., None]:
        """``load`` after fixing the layer's kind (dense or fp8) on its first checkpoint tensor."""
        def choose_then_load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            if layer.quant_kind is None:
                layer.quant_kind = kind
                if kind == _DENSE:  # an ignored layer: a float weight and no scales
                    for name in self._quant_params(layer):
                        delattr(layer, name)
                    old = layer.weight
                    layer.weight = nn.Parameter(torch.empty(old.shape, dtype=layer.dense_dtype, device=old.device),
                                                requires_grad=False)
                    layer.weight.weight_loader = old.weight_loader
            elif layer.quant_kind != kind:
                raise ValueError(f"this layer's checkpoint tensors are both {layer.quant_kind} and {kind}: the "
                                 "projections fused into one layer (q/k/v, gate/up) must all be FP8 or all be "
                                 "on the checkpoint's ignore list")
            load(param, loaded, *shard)
        return choose_then_load

    def _weight_loader(self, layer: nn.Module) -> Callable[..., None]:
        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            if loaded.dtype == FP8_DTYPE:
                kind = _FP8
            elif loaded.dtype in (torch.float16, torch.bfloat16, torch.float32):
                kind = _DENSE
            else:
                raise ValueError(f"weight of dtype {loaded.dtype}: an FP8 checkpoint's linear weights must be "
                                 "float8_e4m3fn (or float16 / bfloat16 / float32 for ignored layers)")
            self._choosing(layer, kind, lambda _p, t, *s: layer.weight_loader(layer.weight, t, *s))(
                param, loaded, *shard)
        return load

    def _scale_loader(self, layer: nn.Module) -> Callable[..., None]:
        """Checkpoint scales -> one row per output feature, then sharded like the weight."""
        cfg = self.config

        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            from vllm_volta.model_executor.layers.linear import copy_weight

            rows = _checkpoint_rows(layer, shard[0] if shard else None)
            scales = loaded.to(torch.float32)
            if cfg.strategy == "block":
                bn = cfg.block_shape[0]
                if scales.dim() != 2 or scales.shape[0] != -(-rows // bn):
                    raise ValueError(f"{cfg.scale_name} has shape {tuple(loaded.shape)}, expected "
                                     f"[{-(-rows // bn)}, ceil(K / {cfg.block_shape[1]})] for {rows} output rows "
                                     f"in {bn}-row blocks")
                scales = scales.repeat_interleave(bn, 0)[:rows]
            elif cfg.strategy == "channel":
                if scales.numel() != rows:
                    raise ValueError(f"{cfg.scale_name} has shape {tuple(loaded.shape)}, expected [{rows}, 1] "
                                     "(one scale per output channel)")
                scales = scales.reshape(rows, 1)
            else:
                if scales.numel() != 1:
                    raise ValueError(f"{cfg.scale_name} has shape {tuple(loaded.shape)}, expected one "
                                     "per-tensor scale")
                scales = scales.reshape(1, 1).expand(rows, 1)
            if _is_row_parallel(layer) and cfg.strategy != "block":
                copy_weight(param.data, scales)  # one group over all inputs: every rank keeps its rows
            else:
                layer.weight_loader(param, scales, *shard)
        return load

    @staticmethod
    def _input_scale_loader(layer: nn.Module) -> Callable[..., None]:
        """Static activation scales: the fused projections' largest (one input, one scale)."""
        def load(param: nn.Parameter, loaded: torch.Tensor, *shard: Any) -> None:
            if loaded.numel() != 1:
                raise ValueError(f"input_scale has shape {tuple(loaded.shape)}, expected one per-tensor scale")
            value = loaded.reshape(1).to(param.device, torch.float32)
            first = not getattr(param, "loaded_once", False)
            param.data.copy_(value if first else torch.maximum(param.data, value))
            param.loaded_once = True
        return load

    # --- compute -----------------------------------------------------------------------------

    def scales(self, layer: nn.Module) -> torch.Tensor:
        return getattr(layer, self.config.scale_name)

    def dense_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """W [N, K] in ``dtype``: weight * scales, computed in ``dtype``."""
        if layer.quant_kind == _DENSE:
            return layer.weight.to(dtype)
        return dequantize_fp8(layer.weight, self.scales(layer), layer.fp8_group_k, dtype)

    def _use_w8a8(self, device: torch.device) -> bool:
        use = self._paths.get(device)
        if use is None:
            use = self._paths[device] = _w8a8_reason(self.config, device) is None
        return use

    def _use_sm70(self, layer: nn.Module, x: torch.Tensor) -> bool:
        """Whether the SM70 FP8 kernels (fp8_sm70.py) compute this layer's x W^T."""
        key = (x.device, x.dtype)
        use = self._sm70.get(key)
        if use is None:
            use = self._sm70[key] = sm70_kernels_reason(x.device, x.dtype) is None
        return use and fp8_sm70.layer_fits(layer.weight.shape[1], layer.fp8_group_k, self.scales(layer).shape[1])

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] -> x W^T + bias [..., N]."""
        if layer.quant_kind == _DENSE:
            return F.linear(x, layer.weight, bias)
        # Decode-sized steps on SM89+ also take fp8_gemv: on an H200 (Qwen3-8B shapes, one row) it
        # ran 1.30x float16 cuBLAS where the Triton W8A8 GEMM ran 0.41x; at 8 rows they were even.
        decode = x.numel() <= fp8_sm70.GEMV_MAX_ROWS * x.shape[-1]
        if self._use_w8a8(x.device) and not (decode and self._use_sm70(layer, x)):
            from vllm_volta.model_executor.layers.quantization.fp8_kernels import w8a8_block_fp8_linear

            block = self.config.block_shape or (128, 128)  # per-channel / tensor: 128-wide activation groups
            out = w8a8_block_fp8_linear(x, layer.weight, self.scales(layer), block)
            return out if bias is None else out + bias
        if self._use_sm70(layer, x):
            return fp8_sm70.fp8_w8a16_linear(x, layer.weight, self.scales(layer), layer.fp8_group_k, bias)
        return F.linear(x, self.dense_weight(layer, x.dtype), bias)


def dequantize_fp8(weight: torch.Tensor, scales: torch.Tensor, group_k: int, dtype: torch.dtype) -> torch.Tensor:
    """weight fp8 [N, K] * scales [N, ceil(K / group_k)] (each over its group of inputs) in ``dtype``;
    no [N, K] copy of the scales."""
    w = weight.to(dtype)
    s = scales.to(dtype)
    n, k = w.shape
    if s.shape[1] == 1:
        return w.mul_(s)
    whole = (k // group_k) * group_k
    if whole:
        w[:, :whole].view(n, whole // group_k, group_k).mul_(s[:, :whole // group_k, None])
    if whole < k:
        w[:, whole:].mul_(s[:, -1:])
    return w
