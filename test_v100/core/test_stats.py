from __future__ import annotations

import logging

import pytest

from vllm_volta.core import stats as stats_mod
from vllm_volta.core.stats import EngineStats, StatLogger


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def collected():
    handler = _Collect()
    stats_mod.logger.addHandler(handler)
    yield handler.messages
    stats_mod.logger.removeHandler(handler)


def snapshot(prompt, gen, queries=0, hits=0):
    return EngineStats(num_running=2, num_waiting=1, kv_cache_usage=0.25, num_free_blocks=3,
                       num_total_blocks=4, prompt_tokens_total=prompt,
                       generation_tokens_total=gen, prefix_cache_queries_total=queries,
                       prefix_cache_hits_total=hits)


def test_logs_deltas_after_the_interval(collected, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(stats_mod.time, "monotonic", lambda: clock[0])
    logger = StatLogger(interval=5.0)
    clock[0] = 102.0
    assert not logger.maybe_log(snapshot(10, 10))
    clock[0] = 110.0
    assert logger.maybe_log(snapshot(100, 50, queries=100, hits=25))
    clock[0] = 120.0
    assert logger.maybe_log(snapshot(100, 150, queries=100, hits=25))
    assert collected[0].startswith("Avg prompt throughput: 10.0 tokens/s, "
                                   "Avg generation throughput: 5.0 tokens/s, Running: 2 reqs, "
                                   "Waiting: 1 reqs, KV cache usage: 25.0%")
    assert collected[0].endswith("Prefix cache hit rate: 25.0%")
    assert "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 10.0" in collected[1]
    assert collected[1].endswith("hit rate: 0.0%")
