"""The GGUF kernels' device code (csrc/kernels/gguf.cuh), compiled for the host with its CUDA builtins
emulated (gguf_host_harness.cpp: 32 threads a warp, shuffles through a barrier), against float64
references of the PyTorch dequantizer: every block type, 1-8 input rows, odd N (a partial block of
rows), K with a partial last step for the 32-weight types; gguf_dequantize bit for bit. The same
cases run on a GPU in test_gguf_ops.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from .compile_utils import CSRC, find_cuda_home
from .gguf_cases import TYPES, assert_close_to_reference, blocks, reference, weight64

HARNESS = Path(__file__).with_name("gguf_host_harness.cpp")
N = 37  # rows: 9 full blocks of 4 warps and one with a single row


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    cxx = shutil.which("g++")
    if cxx is None or find_cuda_home() is None:
        pytest.skip("needs g++ and the CUDA headers (cuda_fp16.h)")
    exe = tmp_path_factory.mktemp("gguf_host") / "harness"
    build = subprocess.run([cxx, "-std=c++20", "-O1", "-pthread", "-w", f"-I{CSRC}",
                            f"-I{find_cuda_home() / 'include'}", str(HARNESS), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    return exe


def _run(exe: Path, args: list[str]) -> None:
    result = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# K per type: partial 1024-weight steps, and (second) two full steps and a partial one.
GEMV_CASES = [(t, k) for t in TYPES for k in ({"Q4_0": 288, "Q8_0": 544, "Q4_K": 512, "Q5_K": 256,
                                                 "Q6_K": 768}[t.name], 2304 if t.name.endswith("K") else 2080)]


@pytest.mark.parametrize("qtype,k", GEMV_CASES, ids=[f"{t.name}-K{k}" for t, k in GEMV_CASES])
def test_gemv_device_code_matches_float64(harness, tmp_path, qtype, k):
    w = blocks(qtype, N, k, seed=int(qtype))
    w.numpy().tofile(tmp_path / "w.bin")
    gen = torch.Generator().manual_seed(int(qtype))
    bias = torch.randn(N, generator=gen).half()
    bias.numpy().tofile(tmp_path / "bias.bin")
    for m in range(1, 9):
        x = torch.randn(m, k, generator=gen).half()
        x.numpy().tofile(tmp_path / "x.bin")
        with_bias = m % 2 == 0
        _run(harness, ["gemv", str(int(qtype)), str(m), str(N), str(k), str(tmp_path / "w.bin"),
                       str(tmp_path / "x.bin"), str(tmp_path / "bias.bin") if with_bias else "-",
                       str(tmp_path / "out.bin")])
        out = torch.from_file(str(tmp_path / "out.bin"), size=m * N, dtype=torch.float16).view(m, N)
        assert_close_to_reference(out, reference(x, w, qtype, bias if with_bias else None))


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequantize_device_code_is_exact(harness, tmp_path, qtype):
    k = {"Q4_0": 288, "Q8_0": 544, "Q4_K": 512, "Q5_K": 256, "Q6_K": 768}[qtype.name]
    n = 5
    w = blocks(qtype, n, k, seed=7 + int(qtype))
    w.numpy().tofile(tmp_path / "w.bin")
    _run(harness, ["dequantize", str(int(qtype)), str(n), str(k), str(tmp_path / "w.bin"), str(tmp_path / "out.bin")])
    out = torch.from_file(str(tmp_path / "out.bin"), size=n * k, dtype=torch.float16).view(n, k)
    assert torch.equal(out, weight64(w, qtype, k).half())
