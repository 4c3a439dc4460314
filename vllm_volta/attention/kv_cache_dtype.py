"""The KV cache's element type (``kv_cache_dtype``, vLLM's values) and FP8 (de)quantization.

- ``"auto"``: the cache holds the model dtype.
- ``"fp8"`` / ``"fp8_e4m3"``: OCP e4m3fn bytes (``torch.float8_e4m3fn``, largest finite 448), as
  vLLM's ``fp8`` on CUDA; ``"fp8_e5m2"``: e5m2 (``torch.float8_e5m2``, largest finite 57344).

An FP8 cache holds ``x / scale`` rounded to nearest even and saturated to the largest finite value,
with one scale per layer for keys and one for values: the checkpoint's ``k_scale`` / ``v_scale``
(or ``kv_scale``) attention parameters where it has them (FP8 checkpoints), else 1.0. Readers
multiply what they read by the scale. Half the bytes per token of an FP16 cache: twice the
blocks in the same memory, and half the bytes a decode step reads.

The PyTorch code here is the CPU path's cache write / read and the reference the CUDA kernels
(csrc/kernels/kv_fp8.cuh) are tested against.
"""

from __future__ import annotations

import re

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def check_kv_cache_dtype(value: object) -> str:
    """``value`` if it is one of KV_CACHE_DTYPES, else ValueError naming kv_cache_dtype."""
    if not isinstance(value, str) or value not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {value!r}")
    return value


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensors' dtype: the model's for "auto", else the FP8 dtype."""
    check_kv_cache_dtype(kv_cache_dtype)
    return model_dtype if kv_cache_dtype == "auto" else _FP8_DTYPES[kv_cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_MAX


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` in float32 as ``dtype`` (FP8): round to nearest even, saturated to +-max."""
    limit = FP8_MAX[dtype]
    return (x.float() / scale).clamp(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """An FP8 cache slice back to ``dtype``: its values times ``scale`` (in float32, then rounded once)."""
    return (x.float() * scale).to(dtype)


def read_cache(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Cache contents as ``dtype``: dequantized from FP8, else a cast (none when it matches)."""
    return dequantize(x, scale, dtype) if is_fp8(x.dtype) else x.to(dtype)


# Checkpoint names of per-layer KV scales (vLLM's): "<attn>.k_scale" / ".v_scale", a legacy
# "<attn>.kv_scale" for both, on the attention module ("self_attn") or its inner Attention
# ("self_attn.attn"); compressed-tensors writes them as "<attn>.k_proj.output_scale" etc.
_SCALE_NAME = re.compile(r"^(?P<attn>.*\.self_attn)(?:\.attn)?\.(?:(?P<kind>k|v|kv)_scale|"
                         r"(?P<proj>k|v)_proj\.output_scale)$")


def kv_scale_target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """For a checkpoint tensor holding a layer's KV scale: (the attention module's name,
    which scales it sets: "k", "v" or both); None for other tensors."""
    m = _SCALE_NAME.match(name)
    if m is None:
        return None
    kind = m.group("kind") or m.group("proj")
    return m.group("attn"), ("k", "v") if kind == "kv" else (kind,)


def scale_value(name: str, tensor: torch.Tensor) -> float:
    """A checkpoint's KV scale as a float (a scalar, or one value per tensor-parallel shard that
    must all agree: the cache has one scale per layer); ValueError if it is not a finite value > 0."""
    flat = tensor.detach().float().flatten()
    if flat.numel() == 0 or not bool((flat == flat[0]).all()):
        raise ValueError(f"checkpoint weight {name!r}: a KV-cache scale must be one value, got shape "
                         f"{tuple(tensor.shape)} with differing entries")
    value = float(flat[0])
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"checkpoint weight {name!r}: a KV-cache scale must be a finite value > 0, got {value}")
    return value


def load_kv_scale(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """If ``name`` is a KV-scale tensor (kv_scale_target), set it on the layer's Attention (the
    ``attn`` inside the named attention module) and return True; False for other tensors.
    ValueError when the model has no Attention there."""
    target = kv_scale_target(name)
    if target is None:
        return False
    from vllm_volta.attention.layer import Attention

    prefix, kinds = target
    attn = None
    for path in (f"{prefix}.attn", prefix):
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(module, Attention):
            attn = module
            break
    if attn is None:
        raise ValueError(f"checkpoint weight {name!r} is a KV-cache scale, but {type(model).__name__} has "
                         f"no Attention layer at {prefix!r}")
    value = scale_value(name, tensor)
    for kind in kinds:
        setattr(attn.impl, f"{kind}_scale", value)
    attn.impl.kv_scales_from_checkpoint = True
    return True


def with_cache_dtype(specs: list, kv_cache_dtype: str) -> list:
    """The model's cache specs with their paged layers (full attention, sliding window) in the
    FP8 dtype of ``kv_cache_dtype``; unchanged for "auto". Block bytes, and so the number of
    blocks a budget holds, follow from the specs' dtype."""
    if kv_cache_dtype == "auto":
        return specs
    import dataclasses

    from vllm_volta.core.kv_cache_spec import is_paged

    dtype = _FP8_DTYPES[kv_cache_dtype]
    return [dataclasses.replace(s, dtype=dtype) if is_paged(s) else s for s in specs]


def describe_kv_scales(model: torch.nn.Module, kv_cache_dtype: str) -> str | None:
    """One log line on an FP8 cache's format and where its scales come from; None for "auto"."""
    if kv_cache_dtype == "auto":
        return None
    from vllm_volta.attention.layer import Attention

    layers = [m for m in model.modules() if isinstance(m, Attention)]
    loaded = sum(bool(m.impl.kv_scales_from_checkpoint) for m in layers)
    fmt = str(_FP8_DTYPES[kv_cache_dtype]).removeprefix("torch.")
    if loaded == 0:
        where = "k/v scales 1.0 (the checkpoint has no k_scale / v_scale)"
    else:
        where = f"k/v scales from the checkpoint for {loaded} of {len(layers)} attention layers"
        if loaded < len(layers):
            where += " (1.0 for the others)"
    return f"KV cache dtype {kv_cache_dtype} ({fmt}, 1 byte per element): {where}"


def check_backend_supports(backend: type | None, dtype: torch.dtype, kv_cache_dtype: str) -> None:
    """ValueError where the attention backend cannot read an FP8 cache for this model dtype:
    VOLTA_PAGED's FP8 decode kernels take float16 / bfloat16 queries only."""
    name = getattr(backend, "name", None)
    if kv_cache_dtype != "auto" and name == "VOLTA_PAGED" and dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} with the VOLTA_PAGED attention backend needs dtype "
                         f"float16 or bfloat16, got {str(dtype).removeprefix('torch.')}; use --dtype half or "
                         f"kv_cache_dtype='auto'")
