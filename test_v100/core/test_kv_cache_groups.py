"""KV-cache groups: planning, unified pages, shared buffers, and the capacity they buy."""
from __future__ import annotations

import pytest
import torch

from vllm_volta.core.grouped_kv_cache_manager import GroupedKVCacheManager
from vllm_volta.core.kv_cache_groups import (allocate_group_caches, plan_kv_cache_groups,
                                             single_table_layout)
from vllm_volta.core.kv_cache_spec import FullAttentionSpec, MambaSpec, SharedKVSpec, SlidingWindowSpec

F16 = torch.float16


def gemma4_31b_like() -> list:
    """60 layers: 5 sliding (W=1024, 16 KV heads x 256) to 1 full (4 KV heads x 512), fp16."""
    sliding = SlidingWindowSpec(16, 256, F16, sliding_window=1024)
    full = FullAttentionSpec(4, 512, F16)
    return ([sliding] * 5 + [full]) * 10


def test_gemma4_like_groups_unify_the_page_size():
    specs = gemma4_31b_like()
    layout = plan_kv_cache_groups(specs, 16)
    # 50 sliding + 10 full layers -> groups of 10: the full group first, then 5 sliding ones.
    assert [(g.sliding_window, g.block_size, len(g.layers)) for g in layout.groups] == (
        [(None, 32, 10)] + [(1024, 16, 10)] * 5)
    # Every group's page is the same bytes: 16 tokens x 16 heads x 256 = 32 tokens x 4 x 512.
    for g in layout.groups:
        assert {specs[i].page_bytes(g.block_size) for i in g.layers} == {layout.page_bytes}
    assert layout.page_bytes == 2 * 16 * 16 * 256 * 2
    assert layout.group_size == 10 and layout.block_bytes(specs) == 10 * layout.page_bytes
    assert layout.layer_group[5] == 0 and layout.layer_group[0] != 0
    covered = sorted(i for g in layout.groups for i in g.layers)
    assert covered == list(range(60))


def test_unequal_kinds_leave_a_smaller_last_group():
    sliding = SlidingWindowSpec(2, 16, F16, sliding_window=8)
    full = FullAttentionSpec(2, 16, F16)
    layout = plan_kv_cache_groups([sliding] * 7 + [full] * 3, 16)
    assert [len(g.layers) for g in layout.groups] == [3, 3, 3, 1]
    assert {g.block_size for g in layout.groups} == {16}


def test_one_kind_keeps_one_table_and_full_models_keep_today_s_layout():
    full = FullAttentionSpec(2, 16, F16)
    layout = plan_kv_cache_groups([full] * 4, 16)
    assert layout.num_groups == 1 and not layout.frees_blocks and layout.page_bytes == 0
    sliding = plan_kv_cache_groups([SlidingWindowSpec(2, 16, F16, sliding_window=32)] * 4, 16)
    assert sliding.num_groups == 1 and sliding.frees_blocks and sliding.groups[0].block_size == 16
    # A window as long as any context frees nothing: one full table (prefix caching stays).
    specs = [SlidingWindowSpec(2, 16, F16, sliding_window=32), full]
    assert plan_kv_cache_groups(specs, 16, max_model_len=33).num_groups == 2
    wide = plan_kv_cache_groups(specs, 16, max_model_len=32)
    assert wide.num_groups == 1 and not wide.frees_blocks and wide.groups[0].layers == (0, 1)


def test_pages_of_unrelated_sizes_meet_at_their_least_common_multiple():
    specs = [SlidingWindowSpec(3, 16, F16, sliding_window=8), FullAttentionSpec(2, 16, F16)]
    layout = plan_kv_cache_groups(specs, 16)  # 192 and 128 bytes a token: pages of 16 x 384
    assert [(g.sliding_window, g.block_size) for g in layout.groups] == [(None, 48), (8, 32)]
    assert layout.page_bytes == 16 * 384


def test_pages_that_cannot_be_unified_fall_back_to_one_table():
    specs = [SlidingWindowSpec(17, 16, F16, sliding_window=8), FullAttentionSpec(2, 16, F16)]
    layout = plan_kv_cache_groups(specs, 16)  # 1088 and 128 bytes a token: blocks of 272 tokens
    assert layout.num_groups == 1 and not layout.frees_blocks and "at most 256" in layout.note
    assert layout.block_bytes(specs) == sum(s.page_bytes(16) for s in specs)


def test_shared_and_recurrent_layers_are_in_no_group():
    sliding = SlidingWindowSpec(2, 16, F16, sliding_window=8)
    full = FullAttentionSpec(2, 16, F16)
    state = MambaSpec(((3, 4),), (torch.float32,))
    specs = [sliding, full, state, SharedKVSpec(0), SharedKVSpec(1)]
    layout = plan_kv_cache_groups(specs, 4)
    assert [g.layers for g in layout.groups] == [(1,), (0,)]
    assert layout.layer_group == (1, 0, -1, 1, 0)
    with pytest.raises(ValueError, match="SharedKVSpec.source"):
        plan_kv_cache_groups([sliding, SharedKVSpec(2), full], 4)


def test_layer_j_of_every_group_views_buffer_j():
    specs = [SlidingWindowSpec(4, 8, F16, sliding_window=8), SlidingWindowSpec(4, 8, F16, sliding_window=8),
             FullAttentionSpec(2, 8, F16), FullAttentionSpec(2, 8, F16), SharedKVSpec(2),
             MambaSpec(((2, 3),), (torch.float32,))]
    layout = plan_kv_cache_groups(specs, 4)
    caches = allocate_group_caches(specs, layout, 6, 3, torch.device("cpu"))
    full, slide = layout.groups  # full layers: 2 x 8 a token -> block size 8; sliding: 4
    assert full.block_size == 8 and slide.block_size == 4
    assert caches[2].shape == (2, 6, 8, 2, 8) and caches[0].shape == (2, 6, 4, 4, 8)
    assert caches[0].data_ptr() == caches[2].data_ptr() and caches[1].data_ptr() == caches[3].data_ptr()
    assert caches[0].data_ptr() != caches[1].data_ptr() and caches[4] is caches[2]
    assert caches[5][0].shape == (3, 2, 3)
    # Block 3 of a sliding layer (keys and values) is exactly block 3 of the full layer beside it.
    caches[0][:, 3].fill_(1.0)
    assert caches[2][:, 3].eq(1.0).all() and caches[2].sum() == caches[0].sum()


def test_capacity_of_a_gemma4_like_cache_at_32k_tokens(make_request):
    """Requests of 32k tokens that fit a fixed budget, from the engine's own block counts, against
    every layer keeping every token: at least 3x."""
    specs = gemma4_31b_like()
    budget = 80 * 2**30
    max_step = 2048  # the token budget of a step (chunked prefill)
    layout = plan_kv_cache_groups(specs, 16)
    num_blocks = budget // layout.block_bytes(specs)
    per_request = layout.blocks_per_request(32768, max_step)
    grouped = (num_blocks - 1) // per_request
    legacy = single_table_layout(specs, 16)
    assert legacy.blocks_per_request(32768, max_step) == 2048
    every_token = (budget // legacy.block_bytes(specs) - 1) // 2048
    assert every_token == 2  # 32768 x 901,120 bytes = 27.5 GiB a request
    assert grouped >= 3 * every_token
    # The manager itself: 32k-token requests prefilled chunk by chunk, one after another, each
    # holding its blocks, until one does not fit.
    kv = GroupedKVCacheManager(num_blocks, layout, max_step_tokens=max_step)
    assert kv.num_blocks_for(32768) == per_request
    admitted = 0
    while True:
        req = make_request([7] * 32768, max_tokens=1)
        while req.num_computed_tokens < 32768:
            if kv.allocate_slots(req, max_step) is None:
                break
            req.num_computed_tokens += max_step
        if req.num_computed_tokens < 32768:
            break
        admitted += 1
        assert kv.num_held_blocks(req.request_id) <= per_request
    assert admitted >= grouped >= 3 * every_token
