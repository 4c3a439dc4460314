"""CpuPlatform: runs everything in plain PyTorch on the host."""

from __future__ import annotations

from typing import Any

import torch

from vllm_volta import envs
from vllm_volta.platforms.interface import Platform, PlatformEnum


class CpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_type = "cpu"
    device_name = "cpu"

    def get_device_name(self, device_id: int = 0) -> str:
        return "cpu"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]

    def _auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        # float32 regardless of the checkpoint: the default model's greedy answers drift in
        # bfloat16 (DESIGN.md section 5), and CPU float32 matmuls are fast enough.
        return torch.float32

    def get_attn_backend_priority(self) -> list[str]:
        return ["TORCH_SDPA"]

    def check_and_update_config(self, vllm_config: Any) -> None:
        """Base rules, plus ``cache_config.cpu_kvcache_space`` (GiB) None -> the env budget."""
        super().check_and_update_config(vllm_config)
        cache_config = getattr(vllm_config, "cache_config", None)
        if cache_config is not None and getattr(cache_config, "cpu_kvcache_space", 0) is None:
            cache_config.cpu_kvcache_space = envs.VLLM_VOLTA_CPU_KVCACHE_SPACE
