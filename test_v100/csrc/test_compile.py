"""Compile checks, no GPU needed: every .cu in csrc/ with nvcc for sm_75 (adapter macro on) and
sm_80 / sm_90 (off); the kernel headers for compute_70 with NVRTC 12.x (CUDA 13 has no sm_70),
proving that the device code is free of host-only includes and BF16 instructions on Volta."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch.utils.cpp_extension  # noqa: F401  (for torch's include dir)

from .compile_utils import CSRC, find_cuda_home, load_nvrtc_12, nvcc_compile, nvrtc_compile, nvrtc_version

CU_FILES = sorted(CSRC.rglob("*.cu"))
# (sm, adapter macro): Volta/Turing builds use the adapter; Ampere/Hopper native.
TARGETS = [("75", True), ("80", False), ("90", False)]
TORCH_INCLUDE = str(Path(torch.__file__).parent / "include")

needs_nvcc = pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit (nvcc) not found")


@pytest.fixture(scope="module")
def nvcc_results(tmp_path_factory):
    """Start every (file, target) compile at once, on as many workers as there are cores."""
    out_dir = tmp_path_factory.mktemp("nvcc")
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    futures = {(f.name, sm): pool.submit(nvcc_compile, f, sm, adapter=adapter, torch_include=TORCH_INCLUDE, out_dir=out_dir)
               for f in CU_FILES for sm, adapter in TARGETS}
    yield futures
    pool.shutdown(wait=True)


def test_there_are_cuda_sources():
    assert {f.name for f in CU_FILES} >= {"layernorm_kernels.cu", "activation_kernels.cu", "cache_kernels.cu",
                                          "attention_kernels.cu", "rotary_kernels.cu",
                                          "sampling_kernels.cu", "awq_kernels.cu"}


@needs_nvcc
@pytest.mark.parametrize("sm,adapter", TARGETS, ids=[f"sm_{sm}" for sm, _ in TARGETS])
@pytest.mark.parametrize("cu_file", [f.name for f in CU_FILES])
def test_nvcc_compiles(nvcc_results, cu_file, sm, adapter):
    result = nvcc_results[(cu_file, sm)].result()
    assert result.returncode == 0, f"nvcc sm_{sm} (adapter={adapter}) failed for {cu_file}:\n{result.stderr[-4000:]}"


# Kernel headers and the template instances a build uses; bf16 included on purpose: on
# compute_70 it must compile (to a trap), with no BF16 instruction in the PTX.
NVRTC_UNITS = {
    "kernels/layernorm.cuh": [
        f"&vllm_volta::rms_norm_kernel<{t}, {v}, {add}>"
        for t, v in (("__half", 8), ("__half", 1), ("float", 4), ("__nv_bfloat16", 8))
        for add in ("false", "true")
    ],
    "kernels/activation.cuh": [
        f"&vllm_volta::act_and_mul_kernel<{t}, {v}, vllm_volta::Activation::{a}>"
        for t, v in (("__half", 8), ("__half", 1), ("float", 4), ("__nv_bfloat16", 8))
        for a in ("kSilu", "kGelu", "kGeluTanh")
    ],
    "kernels/paged_attention.cuh": [
        f"&vllm_volta::paged_attention_decode_kernel<{t}, {d}, {hpb}, {exact}>"
        for t in ("__half", "float", "__nv_bfloat16") for d in (64, 96, 128, 256, 512)
        for hpb, exact in ((1, "true"), (8, "true"), (8, "false"))
    ] + [f"&vllm_volta::paged_attention_reduce_kernel<{t}>" for t in ("__half", "float", "__nv_bfloat16")],
    "kernels/paged_attention_tc.cuh": [f"&vllm_volta::paged_attention_decode_tc_kernel<{t}, {d}>"
                                       for t in ("__half", "__nv_bfloat16") for d in (64, 96, 128, 256, 512)],
    "kernels/cache.cuh": [f"&vllm_volta::reshape_and_cache_kernel<{t}, {v}>"
                          for t, v in (("__half", 8), ("__half", 1), ("float", 4), ("__nv_bfloat16", 8))],
    "kernels/rotary.cuh": [f"&vllm_volta::rotary_embedding_kernel<{t}, {w}, {neox}, {cache}>"
                           for t, w in (("__half", 8), ("__half", 1), ("float", 4), ("__nv_bfloat16", 8))
                           for neox in ("true", "false") for cache in ("true", "false")],
    "kernels/sampling.cuh": [f"&vllm_volta::gumbel_argmax_kernel<{t}, {noise}, {vec}>"
                             for t in ("__half", "float", "__nv_bfloat16") for noise in ("true", "false")
                             for vec in ("true", "false")],
    "kernels/gemv.cuh": [f"&vllm_volta::gemv_kernel<{m}, {r}, {u}, vllm_volta::GemvEpilogue::{e}, {norm}, {multi}>"
                         for m in (1, 2, 3, 4) for r, u in ((2, 4), (4, 2), (8, 1))
                         for e, norm, multi in (("kNone", "false", "false"), ("kNone", "true", "false"),
                                                ("kSiluAndMul", "false", "false"), ("kSiluAndMul", "true", "false"),
                                                ("kAdd", "false", "false"), ("kAdd", "false", "true"),
                                                ("kRopeCache", "false", "false"), ("kRopeCache", "true", "false"),
                                                ("kRopeCache", "false", "true"), ("kRopeCache", "true", "true"))],
    "kernels/awq.cuh": ["&vllm_volta::awq_dequantize_kernel", "&vllm_volta::awq_reduce_kernel"]
                       + [f"&vllm_volta::awq_gemv_kernel<{m}>" for m in (1, 2, 3, 4)],
    "kernels/w4.cuh": ["&vllm_volta::w4_dequantize_kernel"]
                      + [f"&vllm_volta::w4_gemv_kernel<{m}, {r}>" for m in range(1, 9) for r in (1, 2, 4)
                         if m <= 4 or r <= 2],
    "kernels/w4_gemm.cuh": [f"&vllm_volta::w4_gemm_kernel<{bm}, {bn}>"
                            for bm, bn in ((16, 64), (16, 128), (32, 32), (32, 64), (32, 128), (64, 32), (64, 64),
                                           (64, 128))],
    "kernels/gated_delta_rule.cuh": [f"&vllm_volta::gated_delta_rule_kernel<{t}, {st}, {vec}, {ct}, {dk}, {varlen}>"
                                     for t, st in (("__half", "float"), ("__half", "__half"), ("float", "float"),
                                                   ("__nv_bfloat16", "float"))
                                     for vec, ct in ((4, 2), (4, 4), (4, 8), (1, 8)) for dk in (128, 256)
                                     for varlen in ("false", "true")],
    "kernels/causal_conv1d.cuh": [f"&vllm_volta::causal_conv1d_{k}_kernel<{t}, {w}>"
                                  for k in ("update", "fwd", "state")
                                  for t in ("__half", "float", "__nv_bfloat16") for w in (2, 3, 4)],
    "kernels/gated_rms_norm.cuh": [f"&vllm_volta::gated_rms_norm_kernel<{t}>"
                                   for t in ("__half", "float", "__nv_bfloat16")],
    "kernels/moe_routing.cuh": [f"&vllm_volta::topk_kernel<{t}, vllm_volta::MoeScore::{s}>"
                                for t in ("__half", "float", "__nv_bfloat16") for s in ("kSoftmax", "kSigmoid")]
                               + ["&vllm_volta::moe_align_block_size_kernel"]
                               + [f"&vllm_volta::moe_sum_kernel<{t}>" for t in ("__half", "float", "__nv_bfloat16")],
    "kernels/moe_gemv.cuh": [f"&vllm_volta::moe_gemv_act_and_mul_kernel<{t}, {r}, vllm_volta::Activation::{a}>"
                             for t in ("__half", "float", "__nv_bfloat16") for r in (2, 4, 8)
                             for a in ("kSilu", "kGeluTanh")]
                            + [f"&vllm_volta::moe_gemv_down_sum_kernel<{t}, {r}>"
                               for t in ("__half", "float", "__nv_bfloat16") for r in (2, 4, 8)],
    "kernels/moe_gemm.cuh": [f"&vllm_volta::moe_grouped_gemm_kernel<{t}, {bm}>"
                             for t in ("__half", "__nv_bfloat16") for bm in (16, 32, 64)],
}


@pytest.mark.skipif(load_nvrtc_12() is None, reason="NVRTC 12 for CUDA (pip nvidia-cuda-nvrtc-cu12) not installed")
@pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit headers (cuda_fp16.h) not found")
@pytest.mark.parametrize("header", list(NVRTC_UNITS))
def test_kernel_headers_compile_for_volta_with_nvrtc(header):
    lib = load_nvrtc_12()
    assert nvrtc_version(lib)[0] == 12
    source = f'#include "{header}"\n'
    rc, log, ptx = nvrtc_compile(lib, source, NVRTC_UNITS[header], "compute_70",
                                 [CSRC, find_cuda_home() / "include"])
    assert rc == 0, f"NVRTC compute_70 failed for {header}:\n{log}"
    assert ".target sm_70" in ptx
    assert not re.search(r"\.bf16", ptx), "BF16 instructions in compute_70 PTX"
    if any("__nv_bfloat16" in name for name in NVRTC_UNITS[header]):
        assert "trap;" in ptx, "the bf16 instances should compile to a trap below SM80"
    if header == "kernels/paged_attention_tc.cuh":  # Volta's tensor cores, FP32 accumulation
        assert re.search(r"wmma\.mma\.sync\.aligned\.row\.(col|row)\.m8n32k16\.f32\.f32", ptx)
    if header == "kernels/w4_gemm.cuh":  # W4A16 on Volta's tensor cores, FP32 accumulation
        assert re.search(r"wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.f32\.f32", ptx)
    if header == "kernels/moe_gemm.cuh":  # the grouped GEMM on Volta's tensor cores
        assert re.search(r"wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.f32\.f32", ptx)


@pytest.mark.skipif(load_nvrtc_12() is None, reason="NVRTC 12 for CUDA (pip nvidia-cuda-nvrtc-cu12) not installed")
@pytest.mark.skipif(find_cuda_home() is None, reason="CUDA toolkit headers (cuda_fp16.h) not found")
@pytest.mark.parametrize("arch", ["compute_70", "compute_75", "compute_90"])
@pytest.mark.parametrize("header", ["kernels/gemv.cuh", "kernels/paged_attention_tc.cuh"])
def test_programmatic_launch_instructions_only_from_sm90(header, arch):
    # The decode kernels wait for, and release, programmatic dependents with griddepcontrol
    # (kernels/programmatic_launch.cuh): PTX of compute_90 has both; older targets neither (the
    # host then never launches them as dependents: csrc/programmatic_launch.cu).
    lib = load_nvrtc_12()
    rc, log, ptx = nvrtc_compile(lib, f'#include "{header}"\n', NVRTC_UNITS[header][:2], arch,
                                 [CSRC, find_cuda_home() / "include"])
    assert rc == 0, f"NVRTC {arch} failed for {header}:\n{log}"
    for instruction in ("griddepcontrol.wait", "griddepcontrol.launch_dependents"):
        assert (instruction in ptx) == (arch == "compute_90"), (instruction, arch)
