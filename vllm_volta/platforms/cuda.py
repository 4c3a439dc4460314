"""CudaPlatform: NVIDIA GPUs through torch.cuda, decisions keyed by compute capability."""

from __future__ import annotations

from functools import lru_cache

import torch

from vllm_volta.logger import info_once, init_logger, warning_once
from vllm_volta.platforms.interface import (
    DeviceCapability,
    Platform,
    PlatformEnum,
    resolve_capability_override,
)

logger = init_logger(__name__)

# (minimum capability, backend names best first); the first row the device reaches applies.
# There is no FlashAttention here: SM80+ uses the same kernels as Volta, compiled natively.
_ATTN_PRIORITY_BY_CAPABILITY: list[tuple[int, list[str]]] = [
    (80, ["VOLTA_PAGED", "TORCH_SDPA"]),
    (70, ["VOLTA_PAGED", "TORCH_SDPA"]),
    (0, ["TORCH_SDPA"]),
]


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            "CUDA is not available; to take GPU decisions without a GPU set "
            "VLLM_VOLTA_DEVICE_CAPABILITY (e.g. 7.0)"
        )


@lru_cache(maxsize=None)
def _physical_capability(device_id: int) -> DeviceCapability:
    _require_cuda()
    return DeviceCapability(*torch.cuda.get_device_capability(device_id))


@lru_cache(maxsize=None)
def _physical_name(device_id: int) -> str:
    _require_cuda()
    return torch.cuda.get_device_name(device_id)


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_type = "cuda"
    device_name = "cuda"

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability:
        """The device's capability, or VLLM_VOLTA_DEVICE_CAPABILITY when set (no GPU needed)."""
        override = resolve_capability_override()
        if override is None:
            return _physical_capability(device_id)
        if torch.cuda.is_available():
            real = _physical_capability(device_id)
            if override > real:
                warning_once(
                    logger,
                    "VLLM_VOLTA_DEVICE_CAPABILITY=%s is above device %d's real capability %s; "
                    "kernels for the higher capability may fail",
                    override.as_version_str(), device_id, real.as_version_str(),
                )
            elif override != real:
                info_once(
                    logger,
                    "Taking compute capability %s decisions (VLLM_VOLTA_DEVICE_CAPABILITY); "
                    "device %d reports %s",
                    override.as_version_str(), device_id, real.as_version_str(),
                )
        return override

    def get_device_name(self, device_id: int = 0) -> str:
        return _physical_name(device_id)

    def get_device_total_memory(self, device_id: int = 0) -> int:
        _require_cuda()
        return torch.cuda.get_device_properties(device_id).total_memory

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # BF16 arithmetic and tensor cores arrive with SM80.
        if self.has_device_capability(80):
            return [torch.bfloat16, torch.float16, torch.float32]
        return [torch.float16, torch.float32]

    def _auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        # Like vLLM: keep a 16-bit checkpoint's dtype, run float32 checkpoints in float16.
        if config_dtype in (torch.float16, torch.bfloat16):
            return config_dtype
        return torch.float16

    def get_attn_backend_priority(self) -> list[str]:
        capability = self.get_device_capability().to_int()
        for minimum, names in _ATTN_PRIORITY_BY_CAPABILITY:
            if capability >= minimum:
                return list(names)
        return []

    @property
    def supports_custom_all_reduce(self) -> bool:
        # The P2P all-reduce kernels rely on SM80 features; Volta/Turing use NCCL.
        return self.has_device_capability(80)
