"""Attention: metadata of a step, the Attention layer, and the backends that do the math."""

from __future__ import annotations

from vllm_volta.attention.layer import Attention, write_to_kv_cache
from vllm_volta.attention.metadata import AttentionMetadata, build_attn_metadata, compute_positions

__all__ = [
    "Attention",
    "AttentionMetadata",
    "build_attn_metadata",
    "compute_positions",
    "write_to_kv_cache",
]
