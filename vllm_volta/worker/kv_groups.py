"""The model's KV-cache groups, and each Attention layer told which one it reads.

core/kv_cache_groups.py plans the groups from the layers' cache specs; the Attention layers then
need their group (``Attention.kv_cache_group``) to pick that group's block table and slot mapping.
The model's Attention modules, in module order, are its attention layers in ``kv_caches`` order
(one per entry that is not a recurrent-state layer); where they are not (another count, another
shape), the cache falls back to one table shared by every layer, which needs no group.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from vllm_volta.attention.layer import Attention
from vllm_volta.core.kv_cache_groups import KVCacheLayout, plan_kv_cache_groups, single_table_layout
from vllm_volta.core.kv_cache_spec import KVCacheSpec, MambaSpec, SharedKVSpec, is_paged
from vllm_volta.logger import init_logger

logger = init_logger(__name__)


def _mismatch(layers: list[Attention], specs: Sequence[KVCacheSpec]) -> str | None:
    """Why the Attention modules cannot be matched to the specs one to one, or None."""
    attn_specs = [i for i, s in enumerate(specs) if not isinstance(s, MambaSpec)]
    if len(layers) != len(attn_specs):
        return f"{len(layers)} Attention modules for {len(attn_specs)} attention caches"
    for layer, i in zip(layers, attn_specs):
        spec = specs[i]
        if isinstance(spec, SharedKVSpec):
            spec = specs[spec.source]
        if is_paged(spec) and (layer.num_kv_heads, layer.head_size) != (spec.num_kv_heads, spec.head_size):
            return (f"cache {i} holds {spec.num_kv_heads} KV heads of {spec.head_size}, its Attention "
                    f"{layer.num_kv_heads} of {layer.head_size}")
    return None


def describe(layout: KVCacheLayout) -> str:
    """One line: each group's kind, block size and layer count."""
    parts = [f"{'full' if g.sliding_window is None else f'window {g.sliding_window}'} "
             f"x{len(g.layers)} @{g.block_size}" for g in layout.groups]
    return f"{layout.num_groups} group(s): " + ", ".join(parts)


def plan_model_groups(model: nn.Module, specs: Sequence[KVCacheSpec], block_size: int,
                      max_model_len: int | None = None) -> KVCacheLayout:
    """Plan the groups of ``specs`` and set every Attention layer's ``kv_cache_group``."""
    layout = plan_kv_cache_groups(specs, block_size, max_model_len)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if layout.num_groups > 1 and (why := _mismatch(layers, specs)) is not None:
        layout = single_table_layout(specs, block_size, f"layers not matched to caches: {why}")
    if layout.note:
        logger.warning("KV cache: one block table for every layer, each keeping every token (%s)",
                       layout.note)
    attn_group = [g for g, s in zip(layout.layer_group, specs) if not isinstance(s, MambaSpec)]
    for layer, group in zip(layers, attn_group if layout.num_groups > 1 else [0] * len(layers)):
        layer.kv_cache_group = group
    if layout.num_groups > 1 or layout.frees_blocks:
        logger.info("KV cache: %s; sliding groups return the blocks that leave their window",
                    describe(layout))
    return layout
