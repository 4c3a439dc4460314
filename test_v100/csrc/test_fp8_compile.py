"""Compile checks of the FP8-weight kernels, no GPU needed: kernels/fp8_gemv.cuh and fp8_gemm.cuh with
NVRTC 12.x for compute_70 (V100) and compute_75, every template instance the launcher uses, with no
FP8 or BF16 instruction in the PTX (SM70 has neither: the weights are converted with integer
operations; the bfloat16 instances compile to a trap there) and the GEMM on Volta's tensor cores;
for compute_80 the bfloat16 instances are real. nvcc compiles csrc/fp8_kernels.cu for sm_75 /
sm_80 / sm_90 in test_compile.py."""

from __future__ import annotations

import re

import pytest

from .compile_utils import CSRC, find_cuda_home, load_nvrtc_12, nvrtc_compile

# The launcher's instances (csrc/fp8_kernels.cu): 2, 4 or 8 weight rows per block (8: 1-2 input rows).
TYPES = ("__half", "__nv_bfloat16")
UNITS = {
    "kernels/fp8_gemv.cuh": [f"&vllm_volta::fp8_gemv_kernel<{t}, {m}, {r}>"
                             for t in TYPES for m in range(1, 9) for r in ((2, 4, 8) if m <= 2 else (2, 4))]
                            + [f"&vllm_volta::fp8_dequantize_kernel<{t}>" for t in TYPES],
    "kernels/fp8_gemm.cuh": [f"&vllm_volta::fp8_gemm_kernel<{t}, {fm}>" for t in TYPES for fm in (1, 2, 4)]
                            + [f"&vllm_volta::fp8_gemm_reduce_kernel<{t}>" for t in TYPES],
}

needs_nvrtc = [
    pytest.mark.skipif(load_nvrtc_12() is None, reason="NVRTC 12 for CUDA (pip nvidia-cuda-nvrtc-cu12) not installed"),
    pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit headers (cuda_fp16.h) not found"),
]


@pytest.mark.parametrize("arch", ["compute_70", "compute_75", "compute_80"])
@pytest.mark.parametrize("header", list(UNITS))
@needs_nvrtc[0]
@needs_nvrtc[1]
def test_fp8_kernels_compile_without_fp8_instructions(header, arch):
    rc, log, ptx = nvrtc_compile(load_nvrtc_12(), f'#include "{header}"\n', UNITS[header], arch,
                                 [CSRC, find_cuda_home() / "include"])
    assert rc == 0, f"NVRTC {arch} failed for {header}:\n{log}"
    assert f".target sm_{arch[-2:]}" in ptx
    assert len(re.findall(r"^\.(visible|weak) \.entry", ptx, re.M)) == len(UNITS[header])
    assert not re.search(r"\.(e4m3|e5m2)", ptx), "FP8 instructions in pre-SM89 PTX"
    assert "prmt.b32" in ptx  # the byte placement of the integer conversion
    if arch == "compute_80":  # the bfloat16 instances are real here
        assert re.search(r"\.bf16", ptx)
    else:
        assert not re.search(r"\.bf16", ptx) and "trap;" in ptx, "bfloat16 instances must be traps below SM80"
    if header == "kernels/fp8_gemm.cuh":  # float16 MMAs with FP32 accumulation: Volta's tensor cores
        assert re.search(r"wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.f32\.f32", ptx)
