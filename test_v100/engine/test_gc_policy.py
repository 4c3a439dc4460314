"""The engine's GC settings: a raised young threshold, a frozen startup heap."""
from __future__ import annotations

import gc
import weakref

import pytest

from vllm_volta.engine import gc_policy


@pytest.fixture
def saved_gc_state(monkeypatch):
    saved = gc.get_threshold()
    gc.unfreeze()
    monkeypatch.setattr(gc_policy, "_engines_holding_freeze", 0)
    yield
    gc.set_threshold(*saved)
    gc.unfreeze()


def test_threshold_is_raised_never_lowered_and_left_off_when_off(saved_gc_state):
    gc.set_threshold(700, 10, 10)
    gc_policy.raise_gc_threshold()
    assert gc.get_threshold() == (gc_policy.GC_YOUNG_THRESHOLD, 10, 10)
    gc.set_threshold(50_000, 5, 3)
    gc_policy.raise_gc_threshold()
    assert gc.get_threshold() == (50_000, 5, 3)
    gc.set_threshold(0, 10, 10)  # automatic collection off: left off
    gc_policy.raise_gc_threshold()
    assert gc.get_threshold() == (0, 10, 10)


class _Node:
    pass


def test_freeze_collects_garbage_first_then_freezes_survivors(saved_gc_state):
    garbage = _Node()
    garbage.self = garbage  # a cycle: only the collector frees it
    dead = weakref.ref(garbage)
    del garbage
    kept = [_Node()]
    gc_policy.freeze_startup_heap()
    assert dead() is None
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())


def test_the_last_release_unfreezes_and_extra_releases_do_nothing(saved_gc_state):
    gc_policy.freeze_startup_heap()
    gc_policy.freeze_startup_heap()
    gc_policy.release_startup_heap()
    assert gc.get_freeze_count() > 0
    gc_policy.release_startup_heap()
    assert gc.get_freeze_count() == 0
    gc_policy.release_startup_heap()  # unpaired: no error, no effect
    assert gc.get_freeze_count() == 0
    assert gc_policy._engines_holding_freeze == 0
