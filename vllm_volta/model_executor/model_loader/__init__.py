"""Weight loading: get_model (loader.py) for safetensors, GGUF and dummy weights."""

from __future__ import annotations

from vllm_volta.model_executor.model_loader.loader import get_model

__all__ = ["get_model"]
