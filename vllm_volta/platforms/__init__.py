"""The platform layer: the only place that asks what the hardware is (DESIGN.md section 3).

``current_platform`` is chosen on first access, not at import: CudaPlatform when
``torch.cuda.is_available()``, else CpuPlatform.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from vllm_volta.platforms.attention_selector import (
    register_attn_backend,
    registered_attn_backends,
    unregister_attn_backend,
)
from vllm_volta.platforms.interface import (
    DeviceCapability,
    Platform,
    PlatformEnum,
    resolve_capability_override,
)

if TYPE_CHECKING:
    current_platform: Platform

__all__ = [
    "DeviceCapability",
    "Platform",
    "PlatformEnum",
    "current_platform",
    "get_current_platform",
    "register_attn_backend",
    "registered_attn_backends",
    "resolve_capability_override",
    "unregister_attn_backend",
]

_lock = threading.Lock()
_current: Platform | None = None


def get_current_platform() -> Platform:
    """The platform of this process (created on first call)."""
    global _current
    if _current is not None:  # fast path without the lock; the object never changes once set
        return _current
    with _lock:
        if _current is None:
            import torch

            if torch.cuda.is_available():
                from vllm_volta.platforms.cuda import CudaPlatform

                _current = CudaPlatform()
            else:
                from vllm_volta.platforms.cpu import CpuPlatform

                _current = CpuPlatform()
        return _current


def __getattr__(name: str) -> Any:
    # `from vllm_volta.platforms import current_platform` lands here on first use.
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
