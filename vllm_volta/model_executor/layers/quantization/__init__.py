"""Quantized weights: the checkpoint's ``quantization_config`` picks a method, and the linear layers
built while ``quantization(config)`` is active hold that method's tensors instead of a dense weight.

Supported: AWQ 4-bit (awq.py), GPTQ 4 / 8-bit with or without activation order (gptq.py) and
compressed-tensors W4A16 / W8A16 (compressed_tensors.py); 4-bit weights in contiguous groups run
in AWQ's layout, the others through packed_int.py. FP8 checkpoints (``fp8`` and compressed-tensors float, block /
channel / tensor scales) keep one-byte weights (fp8_config.py, fp8.py). The lm_head, embeddings and norms stay dense,
as in the checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from vllm_volta.model_executor.layers.quantization.awq import AWQConfig
from vllm_volta.model_executor.layers.quantization.compressed_tensors import compressed_tensors_config
from vllm_volta.model_executor.layers.quantization.fp8_config import Fp8Config, fp8_config, is_fp8_checkpoint
from vllm_volta.model_executor.layers.quantization.gptq import gptq_config
from vllm_volta.model_executor.layers.quantization.packed_int import PackedIntConfig

SUPPORTED_QUANTIZATION = ("awq", "gptq", "compressed-tensors", "fp8")
_current: list[AWQConfig | None] = [None]


def get_quant_config(hf_config: Any) -> AWQConfig | PackedIntConfig | Fp8Config | None:
    """The quantization of a checkpoint's config (its ``quantization_config``), None when dense;
    ValueError naming the method when it is not supported."""
    text_config = getattr(hf_config, "text_config", None)
    qc = getattr(hf_config, "quantization_config", None) or getattr(text_config, "quantization_config", None)
    if not qc:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = str(qc.get("quant_method", "")).lower()
    if is_fp8_checkpoint(qc):  # fp8, and compressed-tensors with float weights (fp8_config.py)
        return fp8_config(qc)
    if method == "awq":
        return AWQConfig.from_config(qc)
    if method == "gptq":
        return gptq_config(qc)
    if method == "compressed-tensors":
        return compressed_tensors_config(qc)
    if method == "gguf":  # set by model_loader/gguf_config.py for every GGUF file
        from vllm_volta.model_executor.layers.quantization.gguf import GGUFConfig
        return GGUFConfig()
    raise ValueError(f"quantization_config.quant_method {method!r} is not supported; "
                     f"supported: {', '.join(SUPPORTED_QUANTIZATION)}")


@contextlib.contextmanager
def quantization(config: AWQConfig | None) -> Iterator[None]:
    """Linear layers created inside the block use ``config``'s weights (None: dense)."""
    _current.append(config)
    try:
        yield
    finally:
        _current.pop()


def current_quant_config() -> AWQConfig | None:
    return _current[-1]
