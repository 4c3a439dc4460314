"""Per-group block tables: blocks returned past the window, null entries, totals over groups."""
from __future__ import annotations

import pytest
import torch

from vllm_volta.config import SchedulerConfig
from vllm_volta.core.grouped_kv_cache_manager import GroupedKVCacheManager
from vllm_volta.core.kv_cache_groups import plan_kv_cache_groups
from vllm_volta.core.kv_cache_spec import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from vllm_volta.core.scheduler import Scheduler

F16 = torch.float16
WINDOW = 8


def layout(block_size: int = 4, window: int = WINDOW, state: bool = False):
    """One sliding layer and one full layer of the same shape: two groups of block_size."""
    specs = [SlidingWindowSpec(2, 8, F16, sliding_window=window), FullAttentionSpec(2, 8, F16)]
    if state:
        specs.append(MambaSpec(((2, 2),), (F16,)))
    return plan_kv_cache_groups(specs, block_size)


def advance(kv, req, n):
    assert kv.allocate_slots(req, n) is not None
    req.num_computed_tokens += n


def test_sliding_group_returns_blocks_before_the_window(make_request):
    kv = GroupedKVCacheManager(40, layout())
    full, sliding = kv.groups
    assert (full.sliding_window, sliding.sliding_window) == (None, WINDOW)
    req = make_request(range(30))
    advance(kv, req, 30)  # 8 blocks in each group
    assert [len(t) for t in kv.get_group_block_ids(req.request_id)] == [8, 8]
    assert kv.get_num_free_blocks() == 39 - 16
    # The next token (position 30) needs keys 23..30: blocks 0..4 (tokens 0..19) leave.
    advance(kv, req, 1)
    full_ids, sliding_ids = kv.get_group_block_ids(req.request_id)
    assert sliding_ids[:5] == [0] * 5 and 0 not in sliding_ids[5:] and len(sliding_ids) == 8
    assert 0 not in full_ids and len(full_ids) == 8
    assert kv.get_num_free_blocks() == 39 - 16 + 5
    assert kv.num_held_blocks(req.request_id) == 11
    # Tokens 31, 32: block 8 in each group; token 32 needs keys from 25 on (block 6): 5 goes.
    advance(kv, req, 1)
    kv.allocate_slots(req, 1)
    full_ids, sliding_ids = kv.get_group_block_ids(req.request_id)
    assert len(full_ids) == len(sliding_ids) == 9 and sliding_ids[:6] == [0] * 6
    assert kv.get_num_free_blocks() == 39 - 18 + 6
    kv.free(req)
    assert kv.get_num_free_blocks() == 39 and kv.get_group_block_ids(req.request_id) == ([], [])


def test_freed_blocks_serve_other_requests_and_tables_are_new_lists(make_request):
    kv = GroupedKVCacheManager(40, layout())
    a = make_request(range(40))
    advance(kv, a, 40)
    before = kv.get_group_block_ids(a.request_id)
    advance(kv, a, 1)
    after = kv.get_group_block_ids(a.request_id)
    assert after[1] is not before[1] and before[1][0] != 0  # the scheduled table stays as it was
    assert after[1][:8] == [0] * 8  # position 40 reads keys 33.. (block 8 on)
    freed = set(before[1][:8])
    b = make_request(range(20))
    advance(kv, b, 20)
    # Returned blocks are handed out first (a's two new blocks for token 40, then b's ten).
    taken = {i for ids in kv.get_group_block_ids(b.request_id) for i in ids} | {after[0][-1], after[1][-1]}
    assert freed <= taken


def test_a_step_fits_only_if_every_group_fits(make_request):
    kv = GroupedKVCacheManager(9, layout())  # 8 usable blocks
    req = make_request(range(17))
    assert kv.allocate_slots(req, 17) is None  # 5 blocks x 2 groups
    assert kv.get_num_free_blocks() == 8 and kv.get_group_block_ids(req.request_id) == ([], [])
    assert kv.allocate_slots(req, 16) is not None  # 4 + 4
    assert kv.get_num_free_blocks() == 0
    assert kv.num_blocks_for(16) == 8 and not kv.can_ever_fit(17)


def test_blocks_needed_counts_the_window_and_a_step(make_request):
    kv = GroupedKVCacheManager(200, layout(), max_step_tokens=4)
    # Full group: 25 blocks of 100 tokens; sliding: the window before a 4-token step + 4 tokens
    # (11 tokens over at most 4 blocks of 4).
    assert kv.num_blocks_for(100) == 25 + 4
    req = make_request(range(100))
    for _ in range(25):
        advance(kv, req, 4)
        assert kv.num_held_blocks(req.request_id) <= kv.num_blocks_for(req.num_computed_tokens)


def test_state_slots_and_preemption_with_groups(make_request):
    kv = GroupedKVCacheManager(40, layout(state=True), num_state_slots=2)  # one usable slot
    a, b = make_request(range(10)), make_request(range(10))
    advance(kv, a, 10)
    assert kv.get_state_slot(a.request_id) == 1
    assert kv.allocate_slots(b, 10) is None  # no state slot left; nothing allocated
    assert kv.get_num_free_blocks() == 39 - 6
    kv.free(a)
    assert kv.get_num_free_blocks() == 39 and kv.get_state_slot(a.request_id) == -1
    assert kv.allocate_slots(b, 10) is not None and kv.get_state_slot(b.request_id) == 1


def test_scheduler_preempts_and_errors_over_all_groups(make_request):
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    sched = Scheduler(config, 13, 4, True, kv_cache_layout=layout())  # 12 usable blocks
    kv = sched.kv_cache_manager
    assert isinstance(kv, GroupedKVCacheManager) and kv.enable_caching
    too_big = make_request(range(30), max_tokens=4)  # 8 + 8 blocks > 12
    sched.add_request(too_big)
    out = sched.schedule()
    assert out.errored == [too_big] and "KV-cache blocks" in too_big.error
    a, b = make_request(range(12), max_tokens=20), make_request(range(100, 112), max_tokens=20)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()  # 3 + 3 blocks each
    assert [s.req_id for s in out.scheduled] == [a.request_id, b.request_id]
    s = out.scheduled[0]
    assert s.group_block_ids is not None and s.block_ids is s.group_block_ids[0]
    assert kv.get_num_free_blocks() == 0
    sched.update_from_output(out, {a.request_id: [5], b.request_id: [5]})
    out = sched.schedule()  # token 12 needs a 4th block in both groups of both: b is preempted
    assert out.preempted_req_ids == {b.request_id} and [s.req_id for s in out.scheduled] == [a.request_id]
    assert kv.get_group_block_ids(b.request_id) == ([], [])


def test_prefix_hit_needs_the_whole_prefix_in_full_groups_and_the_window_in_sliding_ones(make_request):
    kv = GroupedKVCacheManager(64, layout(), enable_caching=True)
    a = make_request(range(30), max_tokens=20)
    advance(kv, a, 30)
    for _ in range(10):  # decode to 40 tokens: the sliding group returns blocks 0..7
        a.append_output_token_ids([3])
        advance(kv, a, 1)
    full_a, sliding_a = kv.get_group_block_ids(a.request_id)
    assert sliding_a[:7] == [0] * 7
    kv.free(a)
    # b shares a's first 30 tokens: 7 full blocks (28 tokens) are registered in both groups.
    b = make_request(list(range(30)) + [99] * 5)
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 28
    assert [x.block_id for x in hits[0]] == full_a[:7]
    # The sliding group adopts only the window before token 28 (keys 21..27: blocks 5, 6).
    assert [x.block_id for x in hits[1][:5]] == [0] * 5 and len(hits[1]) == 7
    assert all(x.block_hash is not None for x in hits[1][5:])
    # Without block 6 of the sliding group the hit falls back to 24 tokens (keys 17..23).
    kv.pool.uncache_block(hits[1][6])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 24 and [x.block_id for x in hits[0]] == full_a[:6] and hits[1][3].block_id == 0
    free = kv.get_num_free_blocks()
    assert kv.allocate_slots(b, 11, hits) is not None
    b.num_computed_tokens = 35
    full_b, sliding_b = kv.get_group_block_ids(b.request_id)
    assert full_b[:6] == full_a[:6] and sliding_b[:4] == [0] * 4 and sliding_b[4:6] == [x.block_id for x in hits[1][4:]]
    assert len(full_b) == len(sliding_b) == 9
    # Adopted: 6 + 2 hit blocks leave the free list, plus 3 new blocks in each group.
    assert kv.get_num_free_blocks() == free - 8 - 6
    assert kv.prefix_cache_stats.hits == 0  # counted by the scheduler on admission
    kv.free(b)
    assert kv.get_num_free_blocks() == 63


def test_no_hit_for_prompt_logprobs_or_without_caching(make_request):
    kv = GroupedKVCacheManager(64, layout(), enable_caching=True)
    a = make_request(range(20))
    advance(kv, a, 20)
    assert kv.get_computed_blocks(make_request(range(20), prompt_logprobs=1)) == ((), 0)
    assert kv.get_computed_blocks(make_request(range(20)))[1] == 16
    off = GroupedKVCacheManager(64, layout())
    c = make_request(range(20))
    advance(off, c, 20)
    assert off.get_computed_blocks(make_request(range(20))) == ((), 0)


@pytest.mark.parametrize("window", [1, 4, 5])
def test_windows_of_any_size_keep_what_the_next_token_reads(make_request, window):
    kv = GroupedKVCacheManager(64, layout(window=window))
    req = make_request(range(3))
    advance(kv, req, 3)
    for _ in range(40):
        kv.allocate_slots(req, 1)
        ids = kv.get_group_block_ids(req.request_id)[1]
        pos = req.num_computed_tokens  # the step's token: it reads keys pos - window + 1 .. pos
        needed = {p // 4 for p in range(max(pos - window + 1, 0), pos + 1)}
        assert all(ids[i] != 0 for i in needed)
        assert all(ids[i] == 0 for i in range(len(ids)) if (i + 1) * 4 <= pos - window + 1)
        req.num_computed_tokens += 1


def test_failed_step_restarts_sliding_requests_on_fresh_blocks(make_request):
    """A later step may have returned blocks the failed one still needed: the request starts over,
    and nothing the failed step was to write stays registered for prefix caching."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=256)
    sched = Scheduler(config, 64, 4, True, kv_cache_layout=layout())
    kv = sched.kv_cache_manager
    req = make_request(range(20), max_tokens=4)
    sched.add_request(req)
    first = sched.schedule()  # tokens 0..7
    sched.update_from_output(first, {})
    second = sched.schedule()  # tokens 8..15: registers blocks 2, 3
    assert req.num_computed_tokens == 16 and len(kv.pool._cached) == 8
    sched.step_failed(second)
    assert req.num_computed_tokens == 0 and kv.get_group_block_ids(req.request_id) == ([], [])
    assert kv.get_num_free_blocks() == 63
    cached = kv.pool._cached  # blocks 0, 1 of both groups were computed by the first step
    assert len(cached) == 4
    third = sched.schedule()  # starts over (the running request re-allocates from 0)
    assert third.scheduled[0].num_computed_tokens == 0 and third.scheduled[0].num_new_tokens == 8


@pytest.mark.parametrize("caching", [False, True])
def test_random_schedules_keep_ref_counts_and_windows(make_request, caching):
    """Many steps of random requests (shared prefixes, chunked prompts, preemption): every block's
    ref count is the number of table entries naming it, free + held = usable, and each scheduled
    step's table entries cover what its tokens read (the window before them and themselves)."""
    import random
    rng = random.Random(0)
    three = plan_kv_cache_groups([SlidingWindowSpec(2, 8, F16, sliding_window=6), FullAttentionSpec(2, 8, F16),
                                  SlidingWindowSpec(2, 8, F16, sliding_window=11)], 4)
    config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=128)
    sched = Scheduler(config, 48, 4, caching, kv_cache_layout=three)
    kv = sched.kv_cache_manager
    prefix = [rng.randrange(4, 300) for _ in range(20)]
    for step in range(300):
        if step < 200 and rng.random() < 0.3:
            head = prefix[:rng.randrange(0, 21)]
            sched.add_request(make_request(head + [rng.randrange(4, 300) for _ in range(rng.randrange(1, 30))],
                                           max_tokens=rng.randrange(1, 25)))
        out = sched.schedule()
        counts: dict[int, int] = {}
        for rid in kv._tables:
            for ids in kv.get_group_block_ids(rid):
                for i in ids:
                    if i:
                        counts[i] = counts.get(i, 0) + 1
        for block in kv.pool.blocks[1:]:
            assert block.ref_cnt == counts.get(block.block_id, 0)
        assert kv.get_num_free_blocks() + len(counts) == kv.num_usable_blocks
        for s in out.scheduled:
            for g, ids in enumerate(s.group_block_ids):
                group = kv.groups[g]
                start = s.num_computed_tokens - (group.sliding_window or 10**9) + 1
                for pos in range(max(start, 0), s.num_computed_tokens + s.num_new_tokens):
                    assert ids[pos // group.block_size] != 0
        sched.update_from_output(out, {s.req_id: [rng.randrange(4, 300)] for s in out.scheduled if s.samples})
    assert sched.num_preemptions > 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update_from_output(out, {s.req_id: [5] for s in out.scheduled if s.samples})
    assert kv.get_num_free_blocks() == kv.num_usable_blocks
    if caching:
        assert kv.prefix_cache_stats.hits > 0
