"""benchmarks/kernels: timing helpers and the paged-attention benchmark's shape arguments
(the GPU runs themselves are in benchmarks/gpu_verify.sh)."""
from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.kernels.benchmark_paged_attention import add_shape_args, check_shape_args
from benchmarks.kernels.kernel_timing import time_per_call_graphed


def test_graphed_timing_falls_back_to_wall_clock_off_cuda():
    calls = []
    seconds = time_per_call_graphed(lambda: calls.append(1), torch.device("cpu"), iters=7)
    assert seconds >= 0 and len(calls) == 7 + 5  # iters + time_per_call's warm-up
    with pytest.raises(ValueError, match="iters must be >= 1"):
        time_per_call_graphed(lambda: None, torch.device("cpu"), iters=0)


def _shape_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_shape_args(parser)
    args = parser.parse_args(list(argv))
    check_shape_args(args)
    return args


def test_max_seq_len_defaults_to_context_and_must_cover_it():
    assert _shape_args("--context-len", "512").max_seq_len == 512
    assert _shape_args("--context-len", "512", "--max-seq-len", "8192").max_seq_len == 8192
    with pytest.raises(ValueError, match="--max-seq-len .* must be >= --context-len"):
        _shape_args("--context-len", "512", "--max-seq-len", "256")
