from __future__ import annotations

import pytest

from vllm_volta.core.block_hash import hash_block_tokens, hash_blocks
from vllm_volta.core.block_pool import BlockPool


def test_hash_chain_depends_on_parent_and_tokens():
    a = hash_block_tokens(None, [1, 2, 3, 4])
    assert a == hash_block_tokens(None, [1, 2, 3, 4])
    assert a != hash_block_tokens(None, [1, 2, 3, 5])
    b = hash_block_tokens(a, [5, 6, 7, 8])
    assert b != hash_block_tokens(None, [5, 6, 7, 8])
    assert b != hash_block_tokens(hash_block_tokens(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert len(a) == 16
    # Several blocks at once: the same chain; a partial last block is not hashed.
    assert hash_blocks(None, [1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [a, b]
    assert hash_blocks(a, [5, 6, 7, 8], 4) == [b] and hash_blocks(None, [1, 2, 3], 4) == []


def test_null_block_reserved_and_allocation_counts():
    pool = BlockPool(5)
    assert pool.num_usable_blocks == 4
    assert pool.get_num_free_blocks() == 4
    blocks = pool.get_new_blocks(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.free_blocks(blocks)
    assert pool.get_num_free_blocks() == 4
    with pytest.raises(RuntimeError):
        pool.free_blocks(blocks[:1])
    with pytest.raises(ValueError):
        BlockPool(1)


def test_cached_block_survives_free_until_reused_lru():
    pool = BlockPool(4)  # 3 usable
    b1, b2, b3 = pool.get_new_blocks(3)
    h1, h2 = hash_block_tokens(None, [1]), hash_block_tokens(None, [2])
    pool.cache_full_block(b1, h1)
    pool.cache_full_block(b2, h2)
    pool.free_blocks([b2])
    pool.free_blocks([b1])
    pool.free_blocks([b3])  # uncached -> reused first
    assert pool.get_cached_block(h1) is b1 and pool.get_cached_block(h2) is b2
    (x,) = pool.get_new_blocks(1)
    assert x is b3
    (y,) = pool.get_new_blocks(1)  # oldest freed cached block: b2
    assert y is b2 and pool.get_cached_block(h2) is None and b2.block_hash is None
    assert pool.get_cached_block(h1) is b1
    assert pool.num_evictions == 1


def test_touch_removes_free_cached_block_from_free_list():
    pool = BlockPool(3)
    b1, b2 = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [7])
    pool.cache_full_block(b1, h)
    pool.free_blocks([b1])
    assert pool.get_num_free_blocks() == 1
    pool.touch([pool.get_cached_block(h)])
    assert b1.ref_cnt == 1 and pool.get_num_free_blocks() == 0
    pool.touch([b1])  # shared by a second owner
    assert b1.ref_cnt == 2
    pool.free_blocks([b1])
    assert pool.get_num_free_blocks() == 0
    pool.free_blocks([b1, b2])
    assert pool.get_num_free_blocks() == 2


def test_duplicate_hash_keeps_first_and_caching_off():
    pool = BlockPool(3)
    b1, b2 = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [1])
    pool.cache_full_block(b1, h)
    pool.cache_full_block(b2, h)
    assert pool.get_cached_block(h) is b1 and b2.block_hash is None
    assert not pool.reset_prefix_cache()
    pool.free_blocks([b1, b2])
    assert pool.reset_prefix_cache() and pool.get_cached_block(h) is None
    off = BlockPool(3, enable_caching=False)
    (c,) = off.get_new_blocks(1)
    off.cache_full_block(c, h)
    assert off.get_cached_block(h) is None
