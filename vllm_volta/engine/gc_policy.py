"""How the engine's process uses Python's cyclic garbage collector (process-wide settings).

- The young-generation threshold is raised to 10,000 allocations (never lowered; left alone when
  automatic collection is off). A step at batch 1000 allocates thousands of short-lived
  containers (scheduled requests, token lists, outputs); with the default 700, collections in
  mid-step promoted them and triggered full collections, which re-scan every live request's
  token list and the KV block pool. benchmarks/benchmark_host_overhead.py, batch 1000 on CPU:
  the scheduling phase took 6.2 ms per step at 700 and 2.0 ms at 10,000 (the same at 50,000).
- Once an engine is built, the heap it started with (imported libraries, the model's modules,
  the KV block pool) is frozen: full collections skip it. A full collection scans every tracked
  object; in the offline benchmark on the H200 (Qwen2.5-1.5B shape, 1000 x 512 / 256) one took
  261 ms in the middle of the decode steps, 4% of the run. The heap is unfrozen when the last
  engine that froze it shuts down, so its garbage can be collected again.
"""
from __future__ import annotations

import gc

GC_YOUNG_THRESHOLD = 10_000

_engines_holding_freeze = 0


def raise_gc_threshold(young: int = GC_YOUNG_THRESHOLD) -> None:
    """Raise (never lower) the young-generation threshold. Garbage is still collected, only in
    fewer, larger batches."""
    threshold0, threshold1, threshold2 = gc.get_threshold()
    if 0 < threshold0 < young:  # 0: the user turned automatic collection off
        gc.set_threshold(young, threshold1, threshold2)


def freeze_startup_heap() -> None:
    """Collect what is garbage now, then move every surviving object out of the collector's
    generations (gc.freeze). Pair each call with one release_startup_heap()."""
    global _engines_holding_freeze
    gc.collect()
    gc.freeze()
    _engines_holding_freeze += 1


def release_startup_heap() -> None:
    """Undo one freeze_startup_heap(); the last one unfreezes the heap (gc.unfreeze)."""
    global _engines_holding_freeze
    if _engines_holding_freeze == 0:
        return
    _engines_holding_freeze -= 1
    if _engines_holding_freeze == 0:
        gc.unfreeze()
