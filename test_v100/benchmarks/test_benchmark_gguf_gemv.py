"""benchmarks/kernels/benchmark_gguf_gemv.py without a GPU: Llama-3-8B's projection shapes, the layer
parts it times (one buffer of aligned parts, Q4_K_M's q/k/v mix), argument checks and the CUDA
requirement."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import utils
from benchmarks.kernels import benchmark_gguf_gemv as bench
from benchmarks.kernels.benchmark_gemv import layer_shapes


def test_llama_3_8b_projection_shapes():
    shapes = layer_shapes(json.loads((utils.CONFIGS_DIR / "llama-3-8b" / "config.json").read_text()))
    assert shapes == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def test_random_parts_are_packed_gguf_rows():
    parts = bench.random_parts(("Q4_K", "Q6_K"), (5120, 1024), 4096, torch.device("cpu"))
    assert [(p.qtype.name, p.row0, p.rows, tuple(p.blocks.shape)) for p in parts] == [
        ("Q4_K", 0, 5120, (5120, 16 * 144)), ("Q6_K", 5120, 1024, (1024, 16 * 210))]
    base = parts[0].blocks.untyped_storage().data_ptr()
    assert parts[1].blocks.untyped_storage().data_ptr() == base and parts[1].blocks.data_ptr() % 16 == 0


def test_arguments_and_cuda_requirement(monkeypatch):
    args = bench.parse_args([])
    assert args.rows == [1, 4, 8] and args.types == ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
    with pytest.raises(ValueError, match="--rows must be >= 1"):
        bench.parse_args(["--rows", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--types", "Q4_1"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="benchmark_gguf_gemv.py needs a CUDA GPU"):
        bench.run(bench.parse_args([]))
