"""x W for 4-bit layers on a GPU: the checkpoint's tensors repacked once into the K-major layout
(w4_layout.py), then per call a kernel chosen by the number of input rows:

- ``gemv`` (1-8 rows, decode; 1-4 by default): ``w4_gemv``, one pass over the packed weight;
- ``gemm`` (tensor cores, WMMA FP16 / FP32 accumulation, up to ``GEMM_MAX_ROWS`` by default):
  ``w4_gemm`` with a (block_m, block_n, splits) tile;
- ``dense`` (prefill): ``w4_dequantize`` to W^T in float16, then one cuBLAS GEMM.

The choice and launch parameters come from tuned files (kernel_configs.py, op ``w4a16_linear``,
keyed by n, k, group_size; benchmarks/kernels/benchmark_awq.py --tune writes them), else from
``default_config``. AWQ and GPTQ layers (awq.py, packed_int.py) on a CUDA device in float16
repack once their last checkpoint tensor has loaded (``note_loaded``), or at their first call
when no loader ran (dummy weights), and release the checkpoint-layout tensors. A layer first
called inside a CUDA-graph capture keeps the AWQ layout for good (the graph holds its tensors).
After repacking, the layer's qweight parameter holds [N, K/8] and its scales parameter sz
[N, G, 2] (the zero-point tensor is emptied): its weights cannot be loaded again. The CPU path
never repacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers.quantization.w4_layout import repack_awq, supported

logger = init_logger(__name__)

OP = "w4a16_linear"
GEMV_MAX_ROWS = 8  # w4_gemv's limit
DEFAULT_GEMV_ROWS = 4  # without a tuned file: w4_gemv up to here, w4_gemm above
GEMM_MAX_ROWS = 256
KERNELS = ("gemv", "gemm", "dense")
_BLOCK_M = (16, 32, 64)
_BLOCK_N = (32, 64, 128)


@dataclass
class W4Weights:
    """One layer's weight in the K-major layout: qweight int32 [N, K/8], sz float16 [N, G, 2]."""

    qweight: torch.Tensor
    sz: torch.Tensor
    group_size: int
    # rows -> the launch chosen for them (a lookup per call costs microseconds on eager steps)
    configs: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def k(self) -> int:
        return self.qweight.shape[1] * 8

    @property
    def n(self) -> int:
        return self.qweight.shape[0]


def kernels_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the W4A16 CUDA kernels compute x W here: float16 on a GPU, in a CUDA build."""
    from vllm_volta import _custom_ops as ops

    return device.type == "cuda" and dtype == torch.float16 and ops.has_cuda_kernel("w4_gemv")


@torch.no_grad()
def repack_layer(layer: nn.Module, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 group_size: int) -> W4Weights | None:
    """Repack ``layer``'s AWQ-layout tensors into the kernels' layout and release them, where the
    kernels serve it (a GPU, float16, a supported shape, no capture or AWQ-layout graph so far)."""
    cached = layer.__dict__.get("w4_weights")
    if cached is not None or layer.__dict__.get("w4_keep_awq"):
        return cached
    if not kernels_available(qweight.device, scales.dtype) or qweight.numel() == 0:
        return None
    k, n = qweight.shape[0], qweight.shape[1] * 8
    if not supported(k, n, group_size):
        return None
    if torch.cuda.is_current_stream_capturing():  # the graph will read the AWQ tensors: keep them
        layer.__dict__["w4_keep_awq"] = True
        return None
    packed, sz = repack_awq(qweight, qzeros, scales, max_cols=1024)
    weights = W4Weights(packed, sz, group_size)
    # The parameters take the new layout (so the model's parameter bytes stay true); the zero
    # points now live in sz.
    qweight.data, scales.data = packed, sz
    qzeros.data = torch.empty(0, dtype=qzeros.dtype, device=qzeros.device)
    layer.__dict__["w4_weights"] = weights
    return weights


def layer_weights(layer: nn.Module, x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor,
                  scales: torch.Tensor, group_size: int) -> W4Weights | None:
    """The weight the W4A16 kernels serve this call with (repacking now if loading did not), or
    None: the AWQ-layout path serves it."""
    cached = layer.__dict__.get("w4_weights")
    if cached is not None or x.dtype != torch.float16:
        return cached
    return repack_layer(layer, qweight, qzeros, scales, group_size)


def note_loaded(layer: nn.Module, role: str, shard: tuple[Any, ...], roles: tuple[str, ...],
                repack: Callable[[], Any]) -> None:
    """Record that checkpoint tensor ``role`` of ``shard`` (() = every shard) loaded; once all
    ``roles`` of every shard have, call ``repack()``."""
    from vllm_volta.model_executor.layers.quantization.act_order import layer_shard_ids

    done: set[tuple[str, Any]] = layer.__dict__.setdefault("w4_loaded", set())
    ids = layer_shard_ids(layer)
    done.update((role, s) for s in (shard or ids))
    if all((r, s) in done for r in roles for s in ids):
        repack()


def default_config(rows: int, n: int, k: int, num_sms: int) -> dict[str, Any]:
    """The launch used without a tuned file: gemv up to DEFAULT_GEMV_ROWS rows, the tensor-core
    GEMM up to GEMM_MAX_ROWS (a tile for the rows, split along K until the grid covers the SMs
    twice), dequantize + cuBLAS above.

    gemv reads every input row's x from shared memory once per weight chunk of its R rows (R = 4
    here), so its shared-memory bytes per weight grow with the input rows; from ~4 rows the
    GEMM (x read once per tile, padded to 16 rows, the weight dequantized once per block) moves
    fewer."""
    if rows <= DEFAULT_GEMV_ROWS:
        return {"kernel": "gemv", "rows_per_warp": 4}
    if rows > GEMM_MAX_ROWS:
        return {"kernel": "dense"}
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    block_n = 128 if rows > 64 and n >= 8192 else 64
    blocks = -(-n // block_n) * -(-rows // block_m)
    steps = -(-k // 64)
    splits = max(1, min(-(-2 * num_sms // blocks), steps // 4, 16))
    return {"kernel": "gemm", "block_m": block_m, "block_n": block_n, "splits": splits}


def check_config(config: dict[str, Any], rows: int) -> str | None:
    """Why ``config`` cannot serve ``rows`` input rows (None: it can)."""
    kernel = config.get("kernel")
    if kernel not in KERNELS:
        return f"'kernel' must be one of {', '.join(KERNELS)}, got {kernel!r}"
    if kernel == "gemv":
        if rows > GEMV_MAX_ROWS:
            return f"gemv serves 1 to {GEMV_MAX_ROWS} rows, not {rows}"
        r = config.get("rows_per_warp")
        if r not in (1, 2, 4) or (rows > 4 and r == 4):
            return f"'rows_per_warp' must be 1, 2 or 4 (1 or 2 above 4 rows), got {r!r}"
    if kernel == "gemm":
        bm, bn, s = config.get("block_m"), config.get("block_n"), config.get("splits", 1)
        if bm not in _BLOCK_M or bn not in _BLOCK_N or (bm, bn) == (16, 32):
            return f"'block_m' must be one of {_BLOCK_M} and 'block_n' of {_BLOCK_N} (not 16 x 32), got {bm} x {bn}"
        if not isinstance(s, int) or not 1 <= s <= 64:
            return f"'splits' must be an int in 1..64, got {s!r}"
    return None


class _Launch:
    """Per-device facts a launch choice needs, looked up once."""

    _cache: dict[int, tuple[str, int]] = {}

    @classmethod
    def device(cls, device: torch.device) -> tuple[str, int]:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in cls._cache:
            props = torch.cuda.get_device_properties(index)
            cls._cache[index] = (props.name, props.multi_processor_count)
        return cls._cache[index]


def choose_config(rows: int, w: W4Weights, device: torch.device) -> dict[str, Any]:
    """The tuned launch for ``rows`` rows of this shape (kernel_configs.py), else the default;
    a tuned entry that cannot serve ``rows`` (the nearest tuned size was gemv) yields the default."""
    from vllm_volta.kernel_configs import get_kernel_config

    name, sms = _Launch.device(device)
    default = default_config(rows, w.n, w.k, sms)
    config = get_kernel_config(OP, rows, default=default, device_name=name, n=w.n, k=w.k,
                               group_size=w.group_size, dtype="float16")
    return default if check_config(config, rows) is not None else config


def w4_matmul(x: torch.Tensor, w: W4Weights, bias: torch.Tensor | None,
              config: dict[str, Any] | None = None) -> torch.Tensor:
    """x [..., K] float16 (CUDA) -> x W + bias [..., N] with the kernel ``config`` names (default:
    choose_config for the row count)."""
    from vllm_volta import _custom_ops as ops

    rows = x.reshape(-1, x.shape[-1]).to(torch.float16)  # the kernels' dtype (a no-op in float16 models)
    m = rows.shape[0]
    if m == 0:
        out = rows.new_empty(0, w.n)
    else:
        if config is None:
            config = w.configs.get(m) or w.configs.setdefault(m, choose_config(m, w, x.device))
        info_once(logger, "4-bit linear layers: %s", kernel_path_text())
        rows = rows.contiguous()
        kernel = config["kernel"]
        if kernel == "gemv":
            out = torch.empty(m, w.n, dtype=x.dtype, device=x.device)
            ops.w4_gemv(out, rows, w.qweight, w.sz, config["rows_per_warp"])
        elif kernel == "gemm":
            out = torch.empty(m, w.n, dtype=x.dtype, device=x.device)
            ops.w4_gemm(out, rows, w.qweight, w.sz, config["block_m"], config["block_n"], config.get("splits", 1))
        else:
            out = rows @ dense_weight_t(w).t()
    out = out.to(x.dtype)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], w.n)


def dense_weight_t(w: W4Weights) -> torch.Tensor:
    """W^T [N, K] float16 (``w4_dequantize``)."""
    from vllm_volta import _custom_ops as ops

    out = torch.empty(w.n, w.k, dtype=torch.float16, device=w.qweight.device)
    ops.w4_dequantize(out, w.qweight, w.sz)
    return out


def kernel_path_text() -> str:
    return (f"w4_gemv up to {DEFAULT_GEMV_ROWS} rows, w4_gemm (WMMA tensor cores) up to {GEMM_MAX_ROWS}, "
            f"w4_dequantize + cuBLAS above, on weights repacked K-major at load (tuned {OP} configs, "
            "where present, choose per row count)")
