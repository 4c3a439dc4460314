"""Compile checks of the GGUF-block kernels, no GPU needed: kernels/gguf.cuh (with gguf_blocks.cuh)
with NVRTC 12.x for compute_70 (V100) and compute_75, every template instance the launcher uses
(5 block types x 1-8 rows; 4 weight rows a warp for one input row, 2 above; the dequantize
kernels), with no BF16 instruction and no integer-to-float conversion in the PTX. nvcc compiles
csrc/gguf_kernels.cu for sm_75 / sm_80 / sm_90 in test_compile.py."""

from __future__ import annotations

import re

import pytest

from .compile_utils import CSRC, find_cuda_home, load_nvrtc_12, nvrtc_compile

BLOCKS = ("GgufQ4_0", "GgufQ8_0", "GgufQ4K", "GgufQ5K", "GgufQ6K")
INSTANCES = ([f"&vllm_volta::gguf_gemv_kernel<{m}, {4 if m == 1 else 2}, vllm_volta::{b}>"
              for b in BLOCKS for m in range(1, 9)]
             + [f"&vllm_volta::gguf_dequantize_kernel<vllm_volta::{b}>" for b in BLOCKS])


@pytest.mark.skipif(load_nvrtc_12() is None, reason="NVRTC 12 for CUDA (pip nvidia-cuda-nvrtc-cu12) not installed")
@pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit headers (cuda_fp16.h) not found")
@pytest.mark.parametrize("arch", ["compute_70", "compute_75"])
def test_gguf_kernels_compile_for_volta(arch):
    rc, log, ptx = nvrtc_compile(load_nvrtc_12(), '#include "kernels/gguf.cuh"\n', INSTANCES, arch,
                                 [CSRC, find_cuda_home() / "include"])
    assert rc == 0, f"NVRTC {arch} failed for kernels/gguf.cuh:\n{log}"
    assert f".target sm_{arch[-2:]}" in ptx
    assert len(re.findall(r"^\.(visible|weak) \.entry", ptx, re.M)) == len(INSTANCES)
    assert not re.search(r"\.bf16", ptx), "BF16 instructions in pre-SM80 PTX"
    # Q4_K / Q5_K quant bytes go out as one 16-byte load per lane; the others' words are joined by
    # funnel shifts; no I2F-type conversion of the integers.
    assert re.search(r"ld\.global\.nc\.v4\.u32", ptx) and "shf.r.wrap.b32" in ptx
    assert not re.search(r"cvt\.rn\.f32\.[us](8|16|32)", ptx)
