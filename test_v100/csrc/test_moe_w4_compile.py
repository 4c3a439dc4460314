"""Compile checks of the 4-bit MoE kernels, no GPU needed: kernels/moe_w4.cuh instantiated for
every team width and activation compiles for compute_70 with NVRTC 12 (half2 math only: no BF16
instruction in the PTX) and for compute_90; csrc/moe_w4_kernels.cu itself is compiled by nvcc in
test_compile.py with every other .cu file."""

from __future__ import annotations

import re

import pytest

from .compile_utils import CSRC, find_cuda_home, load_nvrtc_12, nvrtc_compile

UNITS = ([f"&vllm_volta::moe_w4_gemv_act_and_mul_kernel<{tl}, vllm_volta::Activation::{a}>"
          for tl in (8, 16, 32) for a in ("kSilu", "kGeluTanh")]
         + [f"&vllm_volta::moe_w4_gemv_down_sum_kernel<{tl}>" for tl in (8, 16, 32)]
         + ["&vllm_volta::moe_w4_dequantize_kernel"])


@pytest.mark.skipif(load_nvrtc_12() is None, reason="NVRTC 12 for CUDA (pip nvidia-cuda-nvrtc-cu12) not installed")
@pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit headers (cuda_fp16.h) not found")
@pytest.mark.parametrize("arch", ["compute_70", "compute_90"])
def test_moe_w4_kernels_compile(arch):
    rc, log, ptx = nvrtc_compile(load_nvrtc_12(), '#include "kernels/moe_w4.cuh"\n', UNITS, arch,
                                 [CSRC, find_cuda_home() / "include"])
    assert rc == 0, f"NVRTC {arch} failed for kernels/moe_w4.cuh:\n{log}"
    assert ptx.count(".entry") == len(UNITS)
    assert re.search(r"fma\.rn\.f16x2", ptx), "the dot products should run as half2 FMAs"
    if arch == "compute_70":
        assert ".target sm_70" in ptx
        assert not re.search(r"\.bf16", ptx), "BF16 instructions in compute_70 PTX"
