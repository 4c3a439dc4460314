"""KV-cache groups under pipeline parallelism: the whole model's plan, each stage's view of it."""
from __future__ import annotations

import torch

from vllm_volta.core.kv_cache_groups import allocate_group_caches, plan_kv_cache_groups
from vllm_volta.core.kv_cache_spec import FullAttentionSpec, MambaSpec, SharedKVSpec, SlidingWindowSpec
from vllm_volta.worker.pp_kv_layout import plan_whole_model, stage_view, whole_model_specs

FULL = FullAttentionSpec(2, 16, torch.float32)
SLIDE = SlidingWindowSpec(2, 16, torch.float32, sliding_window=32)
STATE = MambaSpec(((4, 8),), (torch.float32,))


def test_stages_share_the_whole_models_groups():
    """Stage 0 holds only sliding layers, stage 1 only full ones: planned alone they would
    disagree (one group each, of another kind); from the whole model both see its two groups
    and the block sizes the scheduler hands out."""
    stages = [[SLIDE, SLIDE], [FULL, FULL]]
    whole = plan_whole_model(stages, [None, None], 16, 1024)
    assert whole == plan_kv_cache_groups(stages[0] + stages[1], 16, 1024)
    assert whole.num_groups == 2 and whole.frees_blocks
    first, last = stage_view(whole, 0, 2), stage_view(whole, 2, 2)
    for view in (first, last):
        assert [(g.block_size, g.sliding_window) for g in view.groups] == \
               [(g.block_size, g.sliding_window) for g in whole.groups]
    assert first.layer_group == whole.layer_group[:2] and last.layer_group == whole.layer_group[2:]
    assert [g.layers for g in first.groups] == [(), (0, 1)]  # full group first, held by stage 1
    assert [g.layers for g in last.groups] == [(0, 1), ()]
    # A stage's bytes per block id: one page per buffer, as many buffers as its largest group has
    # layers (here its two layers' pages; two stages of one layer each would hold one page).
    assert first.block_bytes(stages[0]) == last.block_bytes(stages[1]) == 2 * whole.page_bytes
    assert stage_view(whole, 1, 2).block_bytes([SLIDE, FULL]) == whole.page_bytes
    caches = allocate_group_caches(stages[1], last, 5, 0, torch.device("cpu"))
    assert [c.shape for c in caches] == [FULL.cache_shape(5, whole.groups[0].block_size)] * 2


def test_one_table_and_recurrent_state_views():
    """Every layer full (one table, per-layer tensors) with recurrent-state layers: a stage with
    no paged layer holds no block bytes; the other stage's view allocates its layers only."""
    stages = [[STATE, STATE], [FULL, STATE]]
    whole = plan_whole_model(stages, [None, None], 16, None)
    assert whole.num_groups == 1 and whole.layer_group == (-1, -1, 0, -1)
    first, last = stage_view(whole, 0, 2), stage_view(whole, 2, 2)
    assert first.block_bytes(stages[0]) == 0
    assert last.block_bytes(stages[1]) == FULL.page_bytes(16)
    caches = allocate_group_caches(stages[1], last, 3, 4, torch.device("cpu"))
    assert caches[0].shape == FULL.cache_shape(3, 16) and caches[1][0].shape == (4, 4, 8)


def test_shared_cache_sources_are_rebased():
    specs = whole_model_specs([[FULL, FULL], [FULL, SharedKVSpec(0)]])
    assert specs[3] == SharedKVSpec(2)


def test_a_stage_mismatch_falls_back_to_one_table_everywhere():
    whole = plan_whole_model([[SLIDE], [FULL]], [None, "2 Attention modules for 1 attention caches"], 16, 1024)
    assert whole.num_groups == 1 and "stage 1: 2 Attention modules" in whole.note
