"""benchmark_paged_attention --kv-cache-dtype: the runs' caches and byte counts (no GPU needed)."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.kernels.benchmark_paged_attention import bytes_per_call, make_decode_inputs, parse_args


def test_kv_cache_dtypes_parse_and_default_to_auto():
    assert parse_args([]).kv_cache_dtype == ["auto"]
    assert parse_args(["--kv-cache-dtype", "auto", "fp8"]).kv_cache_dtype == ["auto", "fp8"]
    with pytest.raises(SystemExit):
        parse_args(["--kv-cache-dtype", "int8"])


@pytest.mark.parametrize("kv,cache_dtype", [("auto", torch.float16), ("fp8", torch.float8_e4m3fn),
                                            ("fp8_e5m2", torch.float8_e5m2)])
def test_each_run_reads_its_own_cache(kv, cache_dtype):
    args = argparse.Namespace(**{**vars(parse_args(["--context-len", "40", "--num-heads", "4", "--num-kv-heads", "2",
                                                    "--head-size", "64"])), "kv_cache_dtype": kv})
    inputs = make_decode_inputs(args, 3, torch.device("cpu"))
    assert inputs["kv_cache"].dtype == cache_dtype and inputs["query"].dtype == torch.float16
    kv_bytes = 2 * 3 * 40 * 2 * 64 * cache_dtype.itemsize
    assert bytes_per_call(args, 3) == kv_bytes + 2 * 3 * 4 * 64 * 2  # + fp16 queries and outputs
