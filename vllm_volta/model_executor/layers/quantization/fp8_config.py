"""FP8 checkpoints: which ``quantization_config`` is FP8, and what it says.

Formats (weights float8_e4m3fn [N, K], W[n, k] = q[n, k] * scale, scales stored in any float
dtype):
- ``quant_method: fp8`` with ``weight_block_size: [bn, bk]`` (DeepSeek-V3, Qwen3 ``-FP8``):
  ``weight_scale_inv`` [ceil(N / bn), ceil(K / bk)], one scale per block; activations dynamic.
- ``quant_method: fp8`` without a block size (AutoFP8 / vLLM's older format): ``weight_scale``, one
  scale per tensor (per fused projection); ``activation_scheme: static`` adds ``input_scale``.
- ``quant_method: compressed-tensors`` (llm-compressor) with ``config_groups[*].weights`` of
  ``type: float, num_bits: 8``, strategy ``tensor`` ([1]), ``channel`` ([N, 1]) or ``block``
  (``block_structure`` [bn, bk], [ceil(N / bn), ceil(K / bk)]), all named ``weight_scale``; static
  ``input_activations`` add ``input_scale``; none at all is weight-only FP8 (W8A16).
Layers named by ``ignored_layers`` / ``modules_to_not_convert`` / ``ignore`` hold a float
``weight``; the layers here are built without names, so each layer follows its checkpoint
tensors (fp8.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

_FIELD = "quantization_config"
_STRATEGIES = ("tensor", "channel", "block")
_CT_FORMATS = ("float-quantized", "naive-quantized")


def _fail(field: str, message: str) -> ValueError:
    return ValueError(f"{_FIELD}.{field}: {message}")


@dataclass(frozen=True)
class Fp8Config:
    """An FP8 checkpoint's format. ``strategy``: "block", "channel" or "tensor";
    ``block_shape`` (bn, bk) for "block"; ``scale_name``: the checkpoint's scale tensor suffix;
    ``act_quant``: "dynamic", "static" (an ``input_scale`` per layer) or None (weight-only)."""

    quant_method: str
    strategy: str
    block_shape: tuple[int, int] | None
    scale_name: str
    act_quant: str | None
    ignored: tuple[str, ...] = ()

    @property
    def w8a8(self) -> bool:
        """Whether the checkpoint means activations to be FP8 too (else weight-only)."""
        return self.act_quant is not None

    def describe(self) -> str:
        what = (f"block {self.block_shape[0]}x{self.block_shape[1]}" if self.strategy == "block"
                else f"per-{self.strategy}")
        acts = {"dynamic": "dynamic activation scales", "static": "static input_scale",
                None: "weight-only (W8A16)"}[self.act_quant]
        ignored = f", {len(self.ignored)} ignore entries kept float" if self.ignored else ""
        return f"{self.quant_method} FP8 e4m3 {what} weights ({self.scale_name}), {acts}{ignored}"

    def kernel_path(self, device: torch.device, dtype: torch.dtype) -> str:
        from vllm_volta.model_executor.layers.quantization.fp8 import fp8_kernel_path
        return fp8_kernel_path(self, device, dtype)

    def get_quant_method(self) -> Any:
        from vllm_volta.model_executor.layers.quantization.fp8 import Fp8LinearMethod
        return Fp8LinearMethod(self)


def is_fp8_checkpoint(qc: dict[str, Any]) -> bool:
    """Whether a ``quantization_config`` is one of the FP8 formats (fp8, compressed-tensors float)."""
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        return True
    if method != "compressed-tensors" or not isinstance(qc.get("config_groups"), dict):
        return False
    # float weights in a float format; anything else is compressed_tensors.py's to accept or refuse
    return any(isinstance(g, dict) and isinstance(g.get("weights"), dict) and g["weights"].get("type") == "float"
               and (g.get("format") or qc.get("format")) in _CT_FORMATS for g in qc["config_groups"].values())


def _names(value: Any, field: str) -> tuple[str, ...]:
    """A list of module names / ``re:`` patterns, checked."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(e, str) for e in value):
        raise _fail(field, f"must be a list of module names, got {value!r}")
    for entry in value:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as e:
                raise _fail(field, f"{entry!r} is not a valid regex ({e})") from None
    return tuple(value)


def _block(value: Any, field: str) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise _fail(field, f"must be two positive ints [block_n, block_k], got {value!r}")
    return int(value[0]), int(value[1])


def _fp8_method(qc: dict[str, Any]) -> Fp8Config:
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise _fail("activation_scheme", f"{scheme!r} is not supported; supported: dynamic, static")
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise _fail("fmt", f"{fmt!r} is not supported; supported: e4m3")
    ignored = _names(qc.get("ignored_layers"), "ignored_layers") + _names(
        qc.get("modules_to_not_convert"), "modules_to_not_convert")
    if qc.get("weight_block_size") is None:
        return Fp8Config("fp8", "tensor", None, "weight_scale", scheme, ignored)
    block = _block(qc["weight_block_size"], "weight_block_size")
    if scheme != "dynamic":
        raise _fail("activation_scheme", "block-wise FP8 (weight_block_size) supports only 'dynamic'")
    return Fp8Config("fp8", "block", block, "weight_scale_inv", "dynamic", ignored)


def _ct_group(name: str, group: dict[str, Any], top_format: Any) -> tuple[str, tuple[int, int] | None, str | None]:
    """(strategy, block shape, activation quantization) of one compressed-tensors config group."""
    where = f"config_groups.{name}"
    fmt = group.get("format") or top_format
    if fmt not in _CT_FORMATS:
        raise _fail(f"{where}.format" if group.get("format") else "format",
                    f"{fmt!r} is not supported for FP8 weights; supported: {', '.join(_CT_FORMATS)}")
    w = group["weights"]
    if w.get("type") != "float" or w.get("num_bits") != 8:
        raise _fail(f"{where}.weights", f"type {w.get('type')!r} / num_bits {w.get('num_bits')!r}: only FP8 "
                    "(type float, num_bits 8) can share a model with FP8 groups")
    if not w.get("symmetric", True) or w.get("dynamic", False):
        raise _fail(f"{where}.weights", "FP8 weights must be symmetric with static scales")
    strategy = w.get("strategy")
    if strategy not in _STRATEGIES:
        raise _fail(f"{where}.weights.strategy", f"{strategy!r} is not supported; supported: {', '.join(_STRATEGIES)}")
    block = _block(w.get("block_structure"), f"{where}.weights.block_structure") if strategy == "block" else None
    if group.get("output_activations"):
        raise _fail(f"{where}.output_activations", "output quantization is not supported")
    acts = group.get("input_activations")
    if not acts:
        return strategy, block, None
    if acts.get("type") != "float" or acts.get("num_bits") != 8:
        raise _fail(f"{where}.input_activations", f"type {acts.get('type')!r} / num_bits {acts.get('num_bits')!r} "
                    "is not supported; supported: float, 8")
    if acts.get("dynamic") in (True, "local"):
        return strategy, block, "dynamic"
    if acts.get("strategy", "tensor") != "tensor":
        raise _fail(f"{where}.input_activations.strategy", "static activation scales must be per tensor")
    return strategy, block, "static"


def _ct_float(qc: dict[str, Any]) -> Fp8Config:
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise _fail("quantization_status", f"{status!r} is not supported; supported: 'compressed'")
    if qc.get("kv_cache_scheme"):
        raise _fail("kv_cache_scheme", "an FP8 KV cache scheme is not supported (the KV cache stays float)")
    sparsity = qc.get("sparsity_config") or {}
    if sparsity.get("format") not in (None, "dense"):
        raise _fail("sparsity_config.format", f"{sparsity.get('format')!r} (sparse weights) is not supported")
    schemes = {name: _ct_group(name, group, qc.get("format")) for name, group in qc["config_groups"].items()}
    first = next(iter(schemes.values()))
    if any(s != first for s in schemes.values()):
        raise _fail("config_groups", "FP8 schemes with different arguments in one model are not supported")
    strategy, block, acts = first
    return Fp8Config("compressed-tensors", strategy, block, "weight_scale", acts, _names(qc.get("ignore"), "ignore"))


def fp8_config(qc: dict[str, Any]) -> Fp8Config:
    """The config that serves an FP8 ``quantization_config`` (is_fp8_checkpoint); ValueError naming
    the field that is not supported."""
    if str(qc.get("quant_method", "")).lower() == "fp8":
        return _fp8_method(qc)
    return _ct_float(qc)
