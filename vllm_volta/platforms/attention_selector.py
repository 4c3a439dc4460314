"""Attention backend registry and selection.

Backends are referenced by import path, so a backend whose module is missing or broken does not
break the platform layer: it becomes one more candidate with a reason. A backend class follows the
contract in docs/ARCHITECTURE.md: ``name``, ``validate(*, capability, dtype, head_size,
device_type) -> list[str]`` (empty = can run) and ``get_impl_cls()``.

Hook for tests and plug-ins: ``register_attn_backend(name, target)`` adds or replaces a backend,
where ``target`` is a class or a "module.Class" path; ``unregister_attn_backend(name)`` removes it
(a built-in name goes back to its built-in path).
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Union

import torch

from vllm_volta.logger import info_once, init_logger

if TYPE_CHECKING:
    from vllm_volta.platforms.interface import DeviceCapability

logger = init_logger(__name__)

BackendTarget = Union[str, type]

_BUILTIN_BACKENDS: dict[str, str] = {
    "TORCH_SDPA": "vllm_volta.attention.backends.torch_sdpa.TorchSDPABackend",
    "VOLTA_PAGED": "vllm_volta.attention.backends.volta_paged.VoltaPagedBackend",
}
_registry: dict[str, BackendTarget] = dict(_BUILTIN_BACKENDS)
_lock = threading.Lock()


def register_attn_backend(name: str, target: BackendTarget) -> None:
    """Register (or replace) backend ``name``: a class, or a "package.module.Class" path."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"backend name must be a non-empty string; got {name!r}")
    if not isinstance(target, (str, type)):
        raise ValueError(f"backend target must be a class or an import path; got {target!r}")
    with _lock:
        _registry[name.strip().upper()] = target


def unregister_attn_backend(name: str) -> None:
    """Undo ``register_attn_backend``; a built-in name returns to its built-in import path."""
    key = name.strip().upper()
    with _lock:
        if key in _BUILTIN_BACKENDS:
            _registry[key] = _BUILTIN_BACKENDS[key]
        else:
            _registry.pop(key, None)


def registered_attn_backends() -> dict[str, BackendTarget]:
    """A snapshot of the registry: name -> class or import path."""
    with _lock:
        return dict(_registry)


def load_attn_backend(name: str) -> tuple[type | None, list[str]]:
    """Resolve backend ``name`` to its class; on failure return (None, [why])."""
    target = registered_attn_backends().get(name)
    if target is None:
        return None, [f"no backend named {name!r} is registered"]
    if isinstance(target, type):
        return target, []
    module_name, _, cls_name = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is a reason, not a crash
        return None, [f"cannot import {module_name}: {type(e).__name__}: {e}"]
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        return None, [f"{module_name} has no class {cls_name}"]
    return cls, []


def check_attn_backend(
    name: str,
    *,
    capability: DeviceCapability | None,
    dtype: torch.dtype,
    head_size: int,
    device_type: str,
) -> tuple[type | None, list[str]]:
    """Load backend ``name`` and ask it whether it can run; returns (class, reasons it cannot)."""
    cls, reasons = load_attn_backend(name)
    if cls is None:
        return None, reasons
    reasons = list(
        cls.validate(capability=capability, dtype=dtype, head_size=head_size, device_type=device_type)
    )
    return cls, reasons


def select_attn_backend(
    candidates: list[str],
    *,
    capability: DeviceCapability | None,
    dtype: torch.dtype,
    head_size: int,
    device_type: str,
    forced: str | None = None,
) -> type:
    """Return the first backend in ``candidates`` (or the ``forced`` one) that can run.

    Raises ValueError listing every candidate and its reasons when none can.
    """
    if not isinstance(head_size, int) or isinstance(head_size, bool) or head_size <= 0:
        raise ValueError(f"head_size must be a positive integer; got {head_size!r}")
    where = _describe_device(device_type, capability)
    problem = f"dtype={dtype}, head_size={head_size}, {where}"
    check_args = dict(capability=capability, dtype=dtype, head_size=head_size, device_type=device_type)

    if forced is not None:
        if forced not in registered_attn_backends():
            known = ", ".join(sorted(registered_attn_backends()))
            raise ValueError(
                f"VLLM_VOLTA_ATTENTION_BACKEND={forced!r} is not a known attention backend; "
                f"expected one of {known}"
            )
        cls, reasons = check_attn_backend(forced, **check_args)
        if cls is None or reasons:
            raise ValueError(
                f"Attention backend {forced} (forced by VLLM_VOLTA_ATTENTION_BACKEND) cannot run "
                f"with {problem}: {'; '.join(reasons)}"
            )
        info_once(logger, "Using attention backend %s (forced by VLLM_VOLTA_ATTENTION_BACKEND)", forced)
        return cls

    rejected: list[tuple[str, list[str]]] = []
    for name in candidates:
        cls, reasons = check_attn_backend(name, **check_args)
        if cls is not None and not reasons:
            why = f"first usable backend for {where}"
            if rejected:
                why += "; skipped " + "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected)
            info_once(logger, "Using attention backend %s (%s)", name, why)
            return cls
        rejected.append((name, reasons))
    lines = "\n".join(f"  - {n}: {'; '.join(r)}" for n, r in rejected) or "  (no candidates)"
    raise ValueError(f"No attention backend can run with {problem}. Candidates tried:\n{lines}")


def _describe_device(device_type: str, capability: DeviceCapability | None) -> str:
    if capability is None:
        return f"device {device_type}"
    return f"device {device_type} with compute capability {capability.as_version_str()}"
