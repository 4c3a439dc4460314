"""compressed-tensors checkpoints (llm-compressor, ``quant_method: compressed-tensors``): integer
weight-only schemes W4A16 / W8A16 in the "pack-quantized" format.

The format, per linear layer of K inputs and N outputs, b bits (p = 32 / b values per int32), as
the compressed-tensors library documents and writes it (its PackedQuantizationCompressor,
``pack_to_int32`` / ``unpack_from_int32``, and QuantizationArgs):
- a weight value q in [-2**(b-1), 2**(b-1)) is stored as q + 2**(b-1) (unsigned b bits);
- ``weight_packed`` int32 [N, K / p]: p consecutive inputs per int32, input p*i + j in bits b*j;
- ``weight_scale`` [N, G]: G = K / group_size ("group" strategy) or 1 ("channel");
- ``weight_zero_point`` int32 [N / p, G] (asymmetric only): packed like the weight, but along the
  output dimension, and offset like it; symmetric schemes have none (zero 0, i.e. 2**(b-1)
  stored);
- ``weight_g_idx`` [K] (``actorder: group``, or "dynamic"): each input's group; "weight" /
  "static" activation orders keep contiguous groups and store none;
- ``weight_shape`` [2] = (N, K);
- W[n, k] = (stored q - stored zero) * scale[n, group of k].
``ignore`` lists modules (names or ``re:`` regexes) kept dense, and ``config_groups[*].targets``
which are quantized; the layers here are built without their names, so such a layer is
recognised by the checkpoint itself: it holds a dense ``weight`` (dense_or_packed.py).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from vllm_volta.model_executor.layers.quantization.awq import pack_awq
from vllm_volta.model_executor.layers.quantization.packed_int import Converter, PackedIntConfig, unpack_int

_NAMES = (("qweight", "weight_packed"), ("zeros", "weight_zero_point"), ("scales", "weight_scale"),
          ("g_idx", "weight_g_idx"), ("shape", "weight_shape"))
_FIELD = "quantization_config"
_STRATEGIES = ("group", "channel")
_ACT_ORDERS = (None, "static", "weight", "group", "dynamic")


def _check(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{_FIELD}.{field}: {message}")


def _weights_args(name: str, group: Any, top_format: Any) -> dict[str, Any]:
    """One config group's weight arguments, checked; ValueError naming the field."""
    _check(isinstance(group, dict), f"config_groups.{name}", "must be a mapping")
    for key in ("input_activations", "output_activations"):
        _check(not group.get(key), f"config_groups.{name}.{key}",
               "activation quantization (e.g. W8A8) is not supported; weight-only schemes "
               "(W4A16, W8A16) are")
    fmt = group.get("format") or top_format
    _check(fmt == "pack-quantized", f"config_groups.{name}.format" if group.get("format") else "format",
           f"{fmt!r} is not supported; supported: 'pack-quantized'")
    w = group.get("weights")
    _check(isinstance(w, dict), f"config_groups.{name}.weights", "must be given (weight quantization)")
    where = f"config_groups.{name}.weights"
    _check(w.get("type", "int") == "int", f"{where}.type", f"{w.get('type')!r} is not supported; supported: 'int'")
    bits = w.get("num_bits")
    _check(bits in (4, 8), f"{where}.num_bits", f"{bits!r} is not supported; supported: 4, 8")
    strategy = w.get("strategy")
    _check(strategy in _STRATEGIES, f"{where}.strategy",
           f"{strategy!r} is not supported; supported: {', '.join(_STRATEGIES)}")
    group_size = w.get("group_size")
    if strategy == "group":
        _check(isinstance(group_size, int) and not isinstance(group_size, bool) and group_size > 0,
               f"{where}.group_size", f"must be a positive int with strategy 'group', got {group_size!r}")
    else:
        group_size = -1
    _check(not w.get("dynamic", False), f"{where}.dynamic", "dynamic weight scales are not supported")
    _check(w.get("block_structure") is None, f"{where}.block_structure", "block scales are not supported")
    actorder = w.get("actorder")
    _check(actorder in _ACT_ORDERS, f"{where}.actorder",
           f"{actorder!r} is not supported; supported: {', '.join(map(str, _ACT_ORDERS))}")
    return {"bits": bits, "group_size": group_size, "symmetric": bool(w.get("symmetric", True)),
            "act_order": actorder in ("group", "dynamic") and strategy == "group"}


def _only_lm_head(entry: str) -> bool:
    """Whether an ``ignore`` entry can only name the lm_head (always dense here)."""
    if entry.startswith("re:"):
        pattern = entry[3:]
        return pattern in ("lm_head", ".*lm_head", "lm_head$", ".*lm_head$", "^lm_head$")
    return entry == "lm_head"


def compressed_tensors_config(qc: dict[str, Any]) -> PackedIntConfig:
    """The config that serves a compressed-tensors ``quantization_config``; ValueError naming the
    field that is not supported."""
    status = qc.get("quantization_status", "compressed")
    _check(status == "compressed", "quantization_status", f"{status!r} is not supported; supported: 'compressed'")
    _check(not qc.get("kv_cache_scheme"), "kv_cache_scheme", "a quantized KV cache scheme is not supported")
    sparsity = qc.get("sparsity_config") or {}
    _check(sparsity.get("format") in (None, "dense"), "sparsity_config.format",
           f"{sparsity.get('format')!r} (sparse weights) is not supported")
    groups = qc.get("config_groups")
    _check(isinstance(groups, dict) and len(groups) > 0, "config_groups", "must name at least one scheme")
    schemes = {name: _weights_args(name, group, qc.get("format")) for name, group in groups.items()}
    first = next(iter(schemes.values()))
    _check(all(s == first for s in schemes.values()), "config_groups",
           "schemes with different weight arguments in one model are not supported")
    ignore = qc.get("ignore") or []
    _check(isinstance(ignore, list) and all(isinstance(e, str) for e in ignore), "ignore", "must be a list of names")
    for entry in ignore:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as e:
                raise ValueError(f"{_FIELD}.ignore: {entry!r} is not a valid regex ({e})") from None
    targets_all = all(list(g.get("targets") or ["Linear"]) == ["Linear"] for g in groups.values())
    dense_ok = not targets_all or not all(_only_lm_head(e) for e in ignore)
    return PackedIntConfig("compressed-tensors", "compressed-tensors", first["bits"], first["group_size"],
                           first["act_order"], has_zeros=not first["symmetric"], names=_NAMES, dense_ok=dense_ok)


def ct_converter(config: PackedIntConfig) -> Converter:
    """Converts compressed-tensors tensors (by role) to ``config``'s layout (packed_int.py):
    [N, ...] -> [..., N], the weight packed along K ("rows") or repacked to AWQ's layout."""
    def convert(role: str, tensor: torch.Tensor) -> torch.Tensor:
        if role == "qweight":
            if config.layout == "awq":
                return pack_awq(unpack_int(tensor, config.bits, 1).t())
            return tensor.t().contiguous()
        if role == "zeros":
            zeros = unpack_int(tensor, config.bits, 0).t()
            return pack_awq(zeros) if config.layout == "awq" else zeros.contiguous()
        if role == "scales":
            return tensor.t().contiguous()
        if role == "g_idx":
            return tensor.to(torch.int32)
        return tensor
    return convert
