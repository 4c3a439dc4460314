"""How steps ran: a periodic table of token counts, padded sizes and graph kind (--cudagraph-metrics).

Each forward is observed as (tokens, padded tokens, runtime mode): FULL (a decode graph),
PIECEWISE (the pieces around eager attention) or NONE (eager). Every `interval` seconds in which
steps ran, one INFO log lists the step counts per mode and the most frequent rows, most
frequent first (vLLM's `--cudagraph-metrics` reports the same columns).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from vllm_volta.logger import init_logger

logger = init_logger(__name__)

MODES = ("FULL", "PIECEWISE", "NONE")


class CudagraphMetrics:
    """Counts (tokens, padded tokens, mode) per step and logs them every `interval` seconds."""

    def __init__(self, cudagraph_mode: str, interval: float = 5.0, max_rows: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cudagraph_mode = cudagraph_mode
        self.interval = interval
        self.max_rows = max_rows
        self._clock = clock
        self._last = clock()
        self._counts: Counter[tuple[int, int, str]] = Counter()

    def observe(self, num_tokens: int, padded_tokens: int, mode: str) -> None:
        self._counts[(num_tokens, padded_tokens, mode)] += 1
        if self._clock() - self._last >= self.interval:
            self.log()

    def table(self) -> str:
        """The counts since the last log: steps per mode, then the most frequent rows."""
        steps = Counter()
        for (_, _, mode), count in self._counts.items():
            steps[mode] += count
        lines = [f"CUDA graph metrics (mode {self.cudagraph_mode}): steps "
                 + ", ".join(f"{mode} {steps[mode]}" for mode in MODES),
                 "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |"]
        rows = sorted(self._counts.items(), key=lambda item: (-item[1], item[0]))
        for (tokens, padded, mode), count in rows[:self.max_rows]:
            lines.append(f"| {tokens} | {padded} | {padded - tokens} | {mode} | {count} |")
        if len(rows) > self.max_rows:
            rest = sum(count for _, count in rows[self.max_rows:])
            lines.append(f"({len(rows) - self.max_rows} more rows, {rest} steps)")
        return "\n".join(lines)

    def log(self) -> None:
        if self._counts:
            logger.info("%s", self.table())
        self._counts.clear()
        self._last = self._clock()
