"""Compile checks of the FP8 KV-cache kernels, no GPU needed: the cache write and both paged
decode kernels instantiated on an FP8 cache compile for compute_70 with NVRTC 12 (no FP8 or
BF16 instructions in the PTX: SM70 has neither; the bf16 instances compile to a trap), and for
compute_90 (where the bf16 x FP8 instances are real code)."""

from __future__ import annotations

import re

import pytest

from .compile_utils import CSRC, find_cuda_home, load_nvrtc_12, nvrtc_compile

FMTS = ("vllm_volta::Fp8E4M3", "vllm_volta::Fp8E5M2")
UNITS = {
    "kernels/cache.cuh": [f"&vllm_volta::reshape_and_cache_fp8_kernel<{t}, {f}, {v}>"
                          for t, v in (("__half", 8), ("__half", 1), ("float", 4), ("__nv_bfloat16", 8))
                          for f in FMTS],
    "kernels/paged_attention.cuh": [f"&vllm_volta::paged_attention_decode_kernel<{t}, {d}, {hpb}, {exact}, {f}>"
                                    for t in ("__half", "__nv_bfloat16") for d in (64, 96, 128, 256, 512)
                                    for hpb, exact in ((1, "true"), (8, "false")) for f in FMTS],
    "kernels/paged_attention_tc.cuh": [f"&vllm_volta::paged_attention_decode_tc_kernel<{t}, {d}, {f}>"
                                       for t in ("__half", "__nv_bfloat16") for d in (64, 96, 128, 256, 512)
                                       for f in FMTS],
}

needs_nvrtc = [
    pytest.mark.skipif(load_nvrtc_12() is None, reason="NVRTC 12 for CUDA (pip nvidia-cuda-nvrtc-cu12) not installed"),
    pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit headers (cuda_fp16.h) not found"),
]


@needs_nvrtc[0]
@needs_nvrtc[1]
@pytest.mark.parametrize("arch", ["compute_70", "compute_90"])
@pytest.mark.parametrize("header", list(UNITS))
def test_fp8_kv_kernels_compile(header, arch):
    rc, log, ptx = nvrtc_compile(load_nvrtc_12(), f'#include "{header}"\n', UNITS[header], arch,
                                 [CSRC, find_cuda_home() / "include"])
    assert rc == 0, f"NVRTC {arch} failed for {header}:\n{log}"
    # Software decoding / encoding only: no FP8 conversion instructions on any target.
    assert not re.search(r"cvt[.a-z0-9]*\.e4m3|cvt[.a-z0-9]*\.e5m2", ptx), "FP8 conversion instructions in the PTX"
    if arch == "compute_70":
        assert ".target sm_70" in ptx
        assert not re.search(r"\.bf16", ptx), "BF16 instructions in compute_70 PTX"
        assert "trap;" in ptx, "the bf16 instances should compile to a trap below SM80"
    if header == "kernels/paged_attention_tc.cuh":  # FP8 tiles are staged as 16-bit MMA operands
        assert re.search(r"wmma\.mma\.sync\.aligned\.row\.(col|row)\.m8n32k16\.f32\.f32", ptx)
