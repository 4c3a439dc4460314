from __future__ import annotations

import pytest

from vllm_volta.core.block_hash import hash_block_tokens
from vllm_volta.core.kv_cache_manager import KVCacheManager


def test_request_block_hashes_track_full_blocks(make_request):
    req = make_request(range(10), block_size=4)
    assert len(req.block_hashes) == 2
    h0 = hash_block_tokens(None, [0, 1, 2, 3])
    assert req.block_hashes == [h0, hash_block_tokens(h0, [4, 5, 6, 7])]
    req.append_output_token_ids([10, 11])
    assert len(req.block_hashes) == 3
    assert req.block_hashes[2] == hash_block_tokens(req.block_hashes[1], [8, 9, 10, 11])


def test_allocate_grows_block_table_and_free_returns_blocks(make_request):
    kv = KVCacheManager(num_blocks=9, block_size=4)
    req = make_request(range(10))
    assert len(kv.allocate_slots(req, 10)) == 3
    req.num_computed_tokens = 10
    req.append_output_token_ids([99])
    assert kv.allocate_slots(req, 1) == []  # slot 11 still in block 3
    req.num_computed_tokens = 11
    req.append_output_token_ids([98, 97])
    assert len(kv.allocate_slots(req, 2)) == 1  # tokens 12..13 need block 4
    assert len(kv.get_block_ids(req.request_id)) == 4
    assert 0 not in kv.get_block_ids(req.request_id)
    assert kv.get_num_free_blocks() == 4
    kv.free(req)
    assert kv.get_num_free_blocks() == 8 and kv.get_block_ids(req.request_id) == []


def test_a_block_table_handed_out_stays_as_it_was(make_request):
    # A step's scheduled table is the manager's list itself (no copy per request per step):
    # later allocations must replace it, not extend it.
    kv = KVCacheManager(num_blocks=9, block_size=4)
    req = make_request(range(8))
    kv.allocate_slots(req, 8)
    before = kv.get_block_ids(req.request_id)
    snapshot = list(before)
    req.num_computed_tokens = 8
    req.append_output_token_ids([5])
    assert len(kv.allocate_slots(req, 1)) == 1
    assert before == snapshot and kv.get_block_ids(req.request_id)[:2] == snapshot
    assert len(kv.get_block_ids(req.request_id)) == 3


def test_allocation_failure_changes_nothing(make_request):
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = make_request(range(8))
    assert kv.allocate_slots(a, 8) is not None
    b = make_request(range(100, 108))
    assert kv.allocate_slots(b, 8) is None
    assert kv.get_num_free_blocks() == 1 and b.request_id not in kv.req_to_blocks
    with pytest.raises(ValueError):
        kv.allocate_slots(b, 0)


def test_prefix_hit_shares_full_blocks_and_leaves_one_token(make_request):
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = make_request(list(range(12)) + [50, 51])
    assert kv.get_computed_blocks(a) == ([], 0)
    kv.allocate_slots(a, a.num_tokens)
    # Same 12-token prefix, different tail: 3 full blocks hit.
    b = make_request(list(range(12)) + [60])
    hits, n = kv.get_computed_blocks(b)
    assert n == 12 and [h.block_id for h in hits] == kv.get_block_ids(a.request_id)[:3]
    kv.allocate_slots(b, 1, hits)
    assert kv.get_block_ids(b.request_id)[:3] == kv.get_block_ids(a.request_id)[:3]
    assert all(blk.ref_cnt == 2 for blk in hits)
    # Exactly 12 tokens: the last block must be recomputed (logits of the last token).
    c = make_request(range(12))
    assert kv.get_computed_blocks(c)[1] == 8
    for num_tokens, num_hit in ((14, 0), (13, 12), (12, 8)):
        kv.record_prefix_lookup(num_tokens, num_hit)
    stats = kv.prefix_cache_stats
    assert (stats.hits, stats.queries, stats.requests, stats.hit_requests) == (20, 39, 3, 2)
    assert stats.hit_rate == pytest.approx(20 / 39)


def test_freed_prefix_still_hits_and_counts_as_free(make_request):
    kv = KVCacheManager(num_blocks=5, block_size=4)  # 4 usable
    a = make_request(range(9))
    kv.allocate_slots(a, 9)
    kv.free(a)
    assert kv.get_num_free_blocks() == 4
    b = make_request(range(16))
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    # 2 hits are taken out of the free list, plus 2 new blocks: exactly 4.
    new = kv.allocate_slots(b, 8, hits)
    assert new is not None and len(new) == 2 and kv.get_num_free_blocks() == 0


def test_free_hits_count_against_capacity(make_request):
    kv = KVCacheManager(num_blocks=4, block_size=4)  # 3 usable
    a = make_request(range(9))
    kv.allocate_slots(a, 9)
    kv.free(a)
    b = make_request(list(range(8)) + [1, 2, 3, 4, 5, 6, 7, 8, 9])  # 17 tokens -> 5 blocks
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    assert kv.allocate_slots(b, 9, hits) is None
    assert all(h.ref_cnt == 0 for h in hits) and kv.get_num_free_blocks() == 3


def test_prompt_logprobs_and_disabled_caching_skip_prefix_hits(make_request):
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_request(range(9))
    kv.allocate_slots(a, 9)
    assert kv.get_computed_blocks(make_request(range(9), prompt_logprobs=1)) == ([], 0)
    off = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False)
    off.allocate_slots(a, 9)
    assert off.get_computed_blocks(make_request(range(9))) == ([], 0)


def test_can_ever_fit():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv.can_ever_fit(12) and not kv.can_ever_fit(13)
