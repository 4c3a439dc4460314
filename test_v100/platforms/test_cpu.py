"""CpuPlatform: float32 by default, every float dtype allowed, TORCH_SDPA only."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.platforms.cpu import CpuPlatform


def test_cpu_decisions(clean_env):
    p = CpuPlatform()
    assert p.is_cpu() and not p.is_cuda() and p.device_type == "cpu"
    assert p.get_device_name() == "cpu"
    assert p.supported_dtypes == [torch.float32, torch.bfloat16, torch.float16]
    assert p.get_attn_backend_priority() == ["TORCH_SDPA"]
    assert p.supports_custom_all_reduce is False


@pytest.mark.parametrize("cap", ["7.0", "9.0"])
def test_cpu_ignores_capability_override(clean_env, cap):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    p = CpuPlatform()
    assert p.get_device_capability() is None
    # A bf16 checkpoint still runs in float32 on the CPU, and bf16 stays allowed when asked for.
    assert p.resolve_dtype("auto", torch.bfloat16) == torch.float32
    assert p.resolve_dtype("bfloat16", torch.float32) == torch.bfloat16

