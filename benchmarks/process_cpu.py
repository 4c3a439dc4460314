"""CPU time of the server's processes over a benchmark run, from /proc (Linux).

The server's front end (HTTP event loop, output streaming) and its engine core (scheduling,
launches, output building) are separate processes; their CPU seconds per streamed token say
which side's host work a change moved, also on a machine whose model forward is not the
bottleneck's (CPU runs of a tiny model)."""
from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (None if /proc cannot tell)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's children list)."""
    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        return []
    return sorted(set(children))


class ServerCpu:
    """Snapshot the front end (`pid`) and its child processes (the engine core) now;
    ``delta(tokens)`` gives each side's CPU seconds since, and per output token."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = self._sample()

    def _sample(self) -> dict[str, float]:
        sides = {"frontend": cpu_seconds(self.pid)}
        children = [cpu_seconds(c) for c in child_pids(self.pid)]
        sides["engine_core"] = sum(c for c in children if c is not None) if children else None
        return {k: v for k, v in sides.items() if v is not None}

    def delta(self, output_tokens: int) -> dict[str, float]:
        now = self._sample()
        out: dict[str, float] = {}
        for side, start in self._start.items():
            if side in now:
                seconds = now[side] - start
                out[f"{side}_cpu_s"] = seconds
                if output_tokens > 0:
                    out[f"{side}_cpu_us_per_output_token"] = seconds / output_tokens * 1e6
        return out
