"""Pinned host buffers that receive a step's sampled token ids without a copy launch.

With async scheduling the sampling kernel writes the ids straight into pinned (device-mapped)
host memory; the host reads them once the step's event has completed. torch's pinned-memory
cache does not know about such kernel writes, so these buffers are owned here: one is handed
out per launched step and reused only after that step's ids were read (release). Every buffer
stays referenced by the pool, so one whose step was dropped unread is never freed while a kernel
may still write into it.
"""
from __future__ import annotations

import torch


class PinnedIdsPool:
    def __init__(self, min_rows: int = 256) -> None:
        self._min_rows = min_rows
        self._all: list[torch.Tensor] = []
        self._free: list[torch.Tensor] = []

    def acquire(self, rows: int) -> torch.Tensor:
        """A pinned int64 buffer of at least `rows` entries, not in use by another step."""
        for i, buf in enumerate(self._free):
            if buf.numel() >= rows:
                return self._free.pop(i)
        buf = torch.empty(max(rows, self._min_rows), dtype=torch.int64, pin_memory=True)
        self._all.append(buf)
        return buf

    def release(self, buf: torch.Tensor) -> None:
        """`buf`'s step has been read: it may be handed out again."""
        self._free.append(buf)

    @property
    def num_buffers(self) -> int:
        return len(self._all)
