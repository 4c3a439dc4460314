"""KV-cache groups under pipeline parallelism: one plan for the whole model, a view per stage.

The scheduler hands out one set of block tables per request, which every stage reads, so the
groups (their count, block sizes, windows) must be those of the whole model, not of one stage's
layers: a stage with only sliding layers and a stage with only full ones would otherwise plan
different tables. Every rank gathers the stages' cache specs (torch.distributed
all_gather_object), plans the groups of the whole list (core/kv_cache_groups.py), and keeps the
view of its own layers: the same groups, holding only its layers (a group may hold none on a
stage), so a stage allocates memory for its layers only while block ids mean the same everywhere.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from torch import nn

from vllm_volta.attention.layer import Attention
from vllm_volta.core.kv_cache_groups import (KVCacheGroup, KVCacheLayout, plan_kv_cache_groups,
                                             single_table_layout)
from vllm_volta.core.kv_cache_spec import KVCacheSpec, MambaSpec, SharedKVSpec
from vllm_volta.logger import init_logger
from vllm_volta.worker.kv_groups import _mismatch, describe

logger = init_logger(__name__)


def stage_view(layout: KVCacheLayout, start: int, num_layers: int) -> KVCacheLayout:
    """``layout`` (of the whole model) as the stage holding layers [start, start + num_layers)
    sees it: every group, with only this stage's layers, indexed from the stage's first."""
    end = start + num_layers
    groups = tuple(KVCacheGroup(g.block_size, g.sliding_window,
                                tuple(i - start for i in g.layers if start <= i < end))
                   for g in layout.groups)
    return KVCacheLayout(groups, layout.layer_group[start:end], layout.page_bytes, layout.note)


def whole_model_specs(stage_specs: Sequence[Sequence[KVCacheSpec]]) -> list[KVCacheSpec]:
    """The stages' spec lists, in stage order, as one list (shared-cache sources re-based)."""
    specs: list[KVCacheSpec] = []
    for stage in stage_specs:
        offset = len(specs)
        specs.extend(replace(s, source=s.source + offset) if isinstance(s, SharedKVSpec) else s
                     for s in stage)
    return specs


def plan_whole_model(stage_specs: Sequence[Sequence[KVCacheSpec]], mismatches: Sequence[str | None],
                     block_size: int, max_model_len: int | None) -> KVCacheLayout:
    """The groups of every stage's layers; one shared table where some stage's Attention modules
    cannot be matched to its caches (kv_groups.py's rule, decided for all stages alike)."""
    specs = whole_model_specs(stage_specs)
    layout = plan_kv_cache_groups(specs, block_size, max_model_len)
    why = next((f"stage {k}: {w}" for k, w in enumerate(mismatches) if w), None)
    if layout.num_groups > 1 and why is not None:
        layout = single_table_layout(specs, block_size, f"layers not matched to caches: {why}")
    return layout


def plan_stage_groups(model: nn.Module, specs: Sequence[KVCacheSpec], block_size: int,
                      max_model_len: int | None, pp_rank: int, tp_rank: int
                      ) -> tuple[KVCacheLayout, KVCacheLayout]:
    """(the whole model's layout, this stage's view of it); sets every Attention layer's
    ``kv_cache_group``. Collective: every rank of every stage calls it once, together."""
    import torch.distributed as dist
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    mine = (pp_rank, tp_rank, list(specs), _mismatch(layers, specs))
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    # Ranks of one stage hold the same layers: take the stages as this TP rank's peers see them.
    stages = sorted((g for g in gathered if g[1] == tp_rank), key=lambda g: g[0])
    layout = plan_whole_model([g[2] for g in stages], [g[3] for g in stages], block_size, max_model_len)
    start = sum(len(g[2]) for g in stages[:pp_rank])
    view = stage_view(layout, start, len(specs))
    attn_group = [g for g, s in zip(view.layer_group, specs) if not isinstance(s, MambaSpec)]
    for layer, group in zip(layers, attn_group if layout.num_groups > 1 else [0] * len(layers)):
        layer.kv_cache_group = group
    if layout.note and pp_rank == 0 and tp_rank == 0:
        logger.warning("KV cache: one block table for every layer, each keeping every token (%s)",
                       layout.note)
    if (layout.num_groups > 1 or layout.frees_blocks) and pp_rank == 0 and tp_rank == 0:
        logger.info("KV cache over %d pipeline stages: %s", len(stages), describe(layout))
    return layout, view
