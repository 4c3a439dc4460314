"""CudaPlatform: the per-capability decisions, via VLLM_VOLTA_DEVICE_CAPABILITY, and on a real GPU."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.platforms.cuda import CudaPlatform
from vllm_volta.platforms.interface import DeviceCapability

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

# The decisions each capability must take (DESIGN.md section 3), written out independently.
DECISIONS = {
    "7.0": dict(dtypes=[F16, F32], attn=["VOLTA_PAGED", "TORCH_SDPA"], all_reduce=False),
    "7.5": dict(dtypes=[F16, F32], attn=["VOLTA_PAGED", "TORCH_SDPA"], all_reduce=False),
    "8.0": dict(dtypes=[BF16, F16, F32], attn=["VOLTA_PAGED", "TORCH_SDPA"], all_reduce=True),
    "9.0": dict(dtypes=[BF16, F16, F32], attn=["VOLTA_PAGED", "TORCH_SDPA"], all_reduce=True),
    "6.0": dict(dtypes=[F16, F32], attn=["TORCH_SDPA"], all_reduce=False),
}


@pytest.mark.parametrize("cap", sorted(DECISIONS))
def test_decisions_follow_the_override(clean_env, cap):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    p = CudaPlatform()
    expected = DECISIONS[cap]
    assert p.is_cuda() and not p.is_cpu() and p.device_type == "cuda"
    assert p.supported_dtypes == expected["dtypes"]
    assert p.get_attn_backend_priority() == expected["attn"]
    assert p.supports_custom_all_reduce is expected["all_reduce"]


def test_override_is_read_lazily(clean_env):
    p = CudaPlatform()
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "9.0")
    assert p.supports_custom_all_reduce
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    assert not p.supports_custom_all_reduce
    assert p.resolve_dtype("auto", BF16) == F16


def test_priority_list_is_a_copy(clean_env):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    p = CudaPlatform()
    p.get_attn_backend_priority().clear()
    assert p.get_attn_backend_priority() == ["VOLTA_PAGED", "TORCH_SDPA"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_without_gpu_or_override_is_a_clear_error(clean_env):
    with pytest.raises(RuntimeError, match="VLLM_VOLTA_DEVICE_CAPABILITY"):
        CudaPlatform().get_device_capability()
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        CudaPlatform().get_device_name()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_capability_and_name(clean_env):
    p = CudaPlatform()
    assert p.get_device_capability() == DeviceCapability(*torch.cuda.get_device_capability(0))
    assert p.get_device_name() == torch.cuda.get_device_name(0)
    real = torch.cuda.get_device_capability(0)
    assert (BF16 in p.supported_dtypes) == (real >= (8, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_takes_volta_decisions_under_override(clean_env, vv_logs):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    p = CudaPlatform()
    assert p.get_device_capability() == DeviceCapability(7, 0)
    assert p.resolve_dtype("auto", BF16) == F16
    assert not p.supports_custom_all_reduce
    assert p.get_device_name() == torch.cuda.get_device_name(0)  # the name stays real
    if torch.cuda.get_device_capability(0) != (7, 0):
        assert any("VLLM_VOLTA_DEVICE_CAPABILITY" in r.getMessage() for r in vv_logs.records)
