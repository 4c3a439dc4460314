"""Which engine failures end the engine, as opposed to failing the requests of one step.

A step that raises on bad input or a recoverable condition fails the requests in flight and
the engine keeps serving. Some failures leave nothing to serve with: the engine core process
is gone, a tensor-parallel worker is lost, or the GPU reported an error (CUDA errors are sticky:
every later call on the context fails too). Those make the engine dead: the server answers 503
and exits (or, with --restart-engine-on-failure, starts a new engine).
"""

from __future__ import annotations

import torch


class EngineDeadError(RuntimeError):
    """The engine can no longer serve; requests in flight and new ones fail (HTTP 503)."""


class ServerShuttingDown(RuntimeError):
    """The server is stopping and the request did not finish within the shutdown timeout."""


# Messages of failures that leave the device or the worker group unusable.
_FATAL_MARKERS = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "NCCL error",
                  "tensor-parallel worker failure", "device-side assert")


def is_fatal(exc: BaseException) -> bool:
    """True when ``exc`` leaves the engine unable to serve any request."""
    if isinstance(exc, EngineDeadError):
        return True
    accel_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8 raises it for CUDA errors
    if accel_error is not None and isinstance(exc, accel_error):
        return True
    text = str(exc)
    return any(marker in text for marker in _FATAL_MARKERS)
