"""Attention backends. Each module holds one backend class with ``name``, ``validate(...)`` and
``get_impl_cls()`` (contract in docs/ARCHITECTURE.md); the platform layer picks one by priority.

- ``torch_sdpa.TorchSDPABackend`` (TORCH_SDPA): plain PyTorch, any device and dtype.
- ``volta_paged`` (VOLTA_PAGED): CUDA paged attention, SM70+.

Modules are imported by the platform's selector on demand, not here, so a backend that cannot
import on this machine does not break the others.
"""

from __future__ import annotations
