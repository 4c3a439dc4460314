"""get_model: build the model class for a config on a device and fill its weights."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vllm_volta.logger import init_logger
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
from vllm_volta.model_executor.models.registry import get_model_cls
from vllm_volta.model_executor.models.utils import config_head_dim

logger = init_logger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


def resolve_load_format(load_format: str, model_path: str | Path) -> str:
    """"auto" -> "gguf" for a .gguf file, else "safetensors"; explicit formats are checked."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, "
                         f"got {load_format!r}")
    is_gguf = str(model_path).endswith(".gguf")
    if load_format == "auto":
        return "gguf" if is_gguf else "safetensors"
    if load_format == "gguf" and not is_gguf:
        raise ValueError(f"load_format='gguf' needs a .gguf model file, got {str(model_path)!r}")
    if load_format == "safetensors" and is_gguf:
        raise ValueError(f"load_format='safetensors' cannot read the GGUF file {str(model_path)!r}")
    return load_format


def iterate_weights(load_format: str, model_path: str | Path, device: torch.device
                    ) -> Iterable[tuple[str, torch.Tensor]]:
    """HF-named checkpoint tensors for a resolved (non-dummy) load format."""
    if load_format == "gguf":
        from vllm_volta.model_executor.model_loader.gguf_loader import iterate_gguf_weights
        # Dequantizing on the GPU is much faster than on the host.
        return iterate_gguf_weights(model_path, device=device if device.type == "cuda" else None)
    from vllm_volta.model_executor.model_loader.safetensors_loader import (
        iterate_safetensors_weights)
    return iterate_safetensors_weights(model_path)


def get_model(model_config: Any, device: torch.device | str,
              attn_backend: type | None = None) -> nn.Module:
    """The model of ``model_config`` (engine ModelConfig: .hf_config, .dtype, .load_format,
    .model_path, .model) on ``device`` in eval mode, weights loaded.

    ``attn_backend`` defaults to the platform's choice for the model's dtype and head size.
    """
    start = time.perf_counter()
    device = torch.device(device)
    hf_config = model_config.hf_config
    dtype = model_config.dtype
    model_cls = get_model_cls(getattr(hf_config, "architectures", None))
    if attn_backend is None:
        from vllm_volta.platforms import current_platform
        attn_backend = current_platform.get_attn_backend(dtype=dtype,
                                                         head_size=config_head_dim(getattr(hf_config, "text_config", None) or hf_config))
    model_path = model_config.model_path or model_config.model
    load_format = resolve_load_format(model_config.load_format, model_path)

    quant_config = get_quant_config(hf_config)
    if quant_config is not None:
        logger.info("Quantized weights: %s, kept packed; x W: %s", quant_config.describe(),
                    quant_config.kernel_path(device, dtype))
    # parameters are allocated directly on the target device
    with torch.device(device), quantization(quant_config):
        model = model_cls(hf_config, dtype=dtype, attn_backend=attn_backend)
    if load_format == "dummy":
        from vllm_volta.model_executor.model_loader.dummy import initialize_dummy_weights
        initialize_dummy_weights(model)
    else:
        with torch.no_grad():
            loaded = model.load_weights(iterate_weights(load_format, model_path, device))
        missing = sorted({name for name, _ in model.named_parameters()} - loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8
                                              else "")
            raise ValueError(f"checkpoint {str(model_path)!r} lacks weights for: {shown}")
    model.eval()
    num_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logger.info("Loaded %s (%s, %s, %s weights) on %s: %.2f GiB in %.1f s", model_config.model,
                model_cls.__name__, str(dtype).removeprefix("torch."), load_format, device,
                num_bytes / 2**30, time.perf_counter() - start)
    return model
