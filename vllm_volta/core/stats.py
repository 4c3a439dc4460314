"""Engine load snapshots (EngineStats) and the periodic throughput log line."""
from __future__ import annotations

import time
from dataclasses import dataclass

from vllm_volta.logger import init_logger

logger = init_logger(__name__)


@dataclass
class EngineStats:
    """A snapshot of the engine's load (token counters are totals since start)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions_total: int = 0
    prefix_cache_queries_total: int = 0   # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0      # of which found cached


class StatLogger:
    """Logs throughput and load every `interval` seconds (vLLM's periodic INFO line)."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._last_time = time.monotonic()
        self._last: EngineStats | None = None

    def maybe_log(self, stats: EngineStats) -> bool:
        now = time.monotonic()
        elapsed = now - self._last_time
        if elapsed < self.interval:
            return False
        last = self._last
        prompt = stats.prompt_tokens_total - (last.prompt_tokens_total if last else 0)
        gen = stats.generation_tokens_total - (last.generation_tokens_total if last else 0)
        queries = stats.prefix_cache_queries_total - (last.prefix_cache_queries_total if last else 0)
        hits = stats.prefix_cache_hits_total - (last.prefix_cache_hits_total if last else 0)
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, "
            "Prefix cache hit rate: %.1f%%", prompt / elapsed, gen / elapsed, stats.num_running,
            stats.num_waiting, 100 * stats.kv_cache_usage, 100 * hits / queries if queries else 0)
        self._last_time, self._last = now, stats
        return True
