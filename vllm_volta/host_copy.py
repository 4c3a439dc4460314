"""Host -> device copies on the step path that never wait for the device.

A copy from pageable host memory into a CUDA stream first waits for the work already queued on
that stream. With async scheduling a step is prepared while the previous one runs, so such a
copy makes the host wait for the whole previous step, and the GPU then idles while the host
builds and launches the rest of this one. Staging the data in pinned memory makes the copy an
asynchronous one; torch's pinned-memory cache keeps the staging buffer until the copy is done.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


def to_device(data: Any, device: torch.device | str, dtype: torch.dtype | None = None,
              copy_stream: torch.cuda.Stream | None = None) -> torch.Tensor:
    """`data` (a CPU tensor, numpy array or nested list) on `device`, copied without waiting for
    the device's queued work. On the CPU the result may share memory with `data`.

    With `copy_stream` (CUDA) the transfer runs on that stream, beside the work already queued on
    the current one, which only waits for it where it is used: the copy engine's start-up then
    overlaps that work instead of stalling the current stream's next kernel."""
    if isinstance(data, np.ndarray):
        tensor = torch.from_numpy(data)
    elif isinstance(data, torch.Tensor):
        tensor = data
    else:
        tensor = torch.tensor(data, dtype=dtype)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    device = torch.device(device)
    if device.type == "cpu":
        return tensor
    if device.type == "cuda":
        tensor = tensor.pin_memory()
        if copy_stream is not None:
            current = torch.cuda.current_stream(device)
            with torch.cuda.stream(copy_stream):
                out = tensor.to(device, non_blocking=True)
            current.wait_stream(copy_stream)
            out.record_stream(current)  # its memory is reused only after the current stream's use
            return out
    return tensor.to(device, non_blocking=True)
