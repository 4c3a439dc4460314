"""BlockTableCache: each step's table equals one built from scratch, whatever changed."""
from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_volta.worker.block_table import BlockTableCache


def reference(lists: list[list[int]]) -> np.ndarray:
    width = max([len(ids) for ids in lists] + [1])
    table = np.zeros((len(lists), width), np.int32)
    for i, ids in enumerate(lists):
        table[i, :len(ids)] = ids
    return table


def filled(cache: BlockTableCache, lists: list[list[int]]) -> np.ndarray:
    ref = reference(lists)
    out = np.zeros_like(ref)
    cache.fill(lists, np.array([len(ids) for ids in lists], np.int64), out)
    return out


@pytest.mark.parametrize("rows", [3, 40, 300])
def test_steps_of_growing_replaced_and_reordered_rows_match_a_fresh_table(rows):
    rng = random.Random(rows)
    cache = BlockTableCache()
    lists = [[rng.randrange(1, 10_000) for _ in range(rng.randrange(0, 12))] for _ in range(rows)]
    for step in range(60):
        out = filled(cache, lists)
        assert np.array_equal(out, reference(lists)), step
        lists = list(lists)
        event = step % 6
        if event < 3:  # a few requests gain a block (a new list, as the KV manager makes)
            for i in rng.sample(range(rows), max(1, rows // 16)):
                lists[i] = lists[i] + [rng.randrange(1, 10_000)]
        elif event == 3:  # a request leaves, another takes its row with a shorter table
            lists[rng.randrange(rows)] = [rng.randrange(1, 10_000)]
        elif event == 4:  # the batch order changes: every row differs
            rng.shuffle(lists)
        else:  # one row grows far past the others (the table widens beyond the spare columns)
            i = rng.randrange(rows)
            lists[i] = lists[i] + list(range(1, 20))


def test_row_count_change_and_empty_rows():
    cache = BlockTableCache()
    a, b = [5, 6, 7], []
    assert np.array_equal(filled(cache, [a, b]), reference([a, b]))
    assert np.array_equal(filled(cache, [a, b, [9]]), reference([a, b, [9]]))
    assert np.array_equal(filled(cache, [b]), reference([b]))


def test_unchanged_lists_are_not_read_again():
    """A row whose list is the same object is reused, not re-read (the point of the cache)."""
    cache = BlockTableCache()
    lists = [[1, 2], [3, 4]] * 8
    filled(cache, lists)
    lists[0].append(99)  # the KV manager never does this: only a new object counts as a change
    out = filled(cache, lists)
    assert out[0].tolist() == [1, 2, 0]  # width 3 now, the row as it was
