"""Model classes keyed by HF architecture name (see registry.py)."""

from __future__ import annotations

from vllm_volta.model_executor.models.registry import get_model_cls, get_supported_archs

__all__ = ["get_model_cls", "get_supported_archs"]
