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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_timing_replays_work_that_allocates_during_the_capture():
    # As the paged-attention op's split-context scratch: memory allocated inside the captured
    # calls must stay the graph's while it replays.
    x = torch.randn(1 << 22, device="cuda")
    out = torch.empty_like(x)
    seconds = time_per_call_graphed(lambda: torch.exp(x * 2.0, out=out), torch.device("cuda"), iters=4)
    torch.cuda.synchronize()
    assert seconds > 0
    torch.testing.assert_close(out, torch.exp(x * 2.0))


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


def test_gemv_benchmark_shapes_come_from_the_config():
    from benchmarks.kernels.benchmark_gemv import layer_shapes, parse_args

    llama = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336}
    assert layer_shapes(llama) == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                                   "down": (4096, 14336)}
    qwen3 = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "intermediate_size": 3072}
    assert layer_shapes(qwen3)["qkv"] == (4096, 1024) and layer_shapes(qwen3)["o"] == (1024, 2048)
    with pytest.raises(ValueError, match="--batch-sizes must be in 1..4"):
        parse_args(["--batch-sizes", "1", "8"])


def test_gemv_launch_split_slices_cover_the_rows_once():
    from benchmarks.kernels.benchmark_gemv import row_slices

    for n, pieces in ((28672, 16), (10, 3), (7, 7), (5, 1)):
        slices = row_slices(n, pieces)
        rows = [r for s in slices for r in range(n)[s]]
        assert rows == list(range(n)) and len(slices) == pieces
        assert max(s.stop - s.start for s in slices) - min(s.stop - s.start for s in slices) <= 1
    with pytest.raises(ValueError, match="pieces must be in 1..4"):
        row_slices(4, 5)


def test_graph_capture_benchmark_arguments_and_cuda_requirement(monkeypatch):
    from benchmarks.kernels import benchmark_graph_capture as bench

    args = bench.parse_args(["--num-graphs", "4", "--layers", "2", "--path", "driver"])
    assert (args.num_graphs, args.layers, args.hidden, args.path) == (4, 2, 4096, "driver")
    with pytest.raises(ValueError, match="--num-graphs must be >= 1"):
        bench.parse_args(["--num-graphs", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--path", "cupy"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.run(args)


def test_sampling_benchmark_arguments_and_cuda_requirement(monkeypatch):
    from benchmarks.kernels import benchmark_sampling as bench

    args = bench.parse_args(["--num-rows", "8", "--vocab-size", "100", "--dtype", "float"])
    assert (args.num_rows, args.vocab_size, args.dtype) == (8, 100, "float")
    assert bench.parse_args([]).num_rows == 1000  # the offline benchmark's decode batch
    with pytest.raises(ValueError, match="--vocab-size must be >= 1"):
        bench.parse_args(["--vocab-size", "0"])
    with pytest.raises(ValueError, match="dtype must be one of"):
        bench.parse_args(["--dtype", "int8"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="benchmark_sampling.py needs a CUDA GPU"):
        bench.run(args)


def test_graph_capture_benchmark_work_runs_on_cpu():
    from benchmarks.kernels.benchmark_graph_capture import make_work

    out = make_work(3, 16, torch.device("cpu"))()
    assert out.shape == (1, 16) and out.dtype == torch.half
    assert bool((out >= 0).all() and (out <= 2).all())  # abs, then clamp(max=2)


def test_tuner_merge_keeps_the_batch_sizes_not_retuned(monkeypatch, tmp_path):
    from benchmarks.kernels.tune_paged_attention import merged_table, parse_args
    from vllm_volta.kernel_configs import load_kernel_config_table, write_kernel_config

    assert parse_args(["--merge"]).merge and not parse_args([]).merge
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    shape = dict(head_size=128, num_kv_heads=8, dtype=torch.float16)
    old = {1: {"partition_size": 128, "num_threads": 256}, 64: {"partition_size": 1024, "num_threads": 128}}
    write_kernel_config("paged_attention_decode", old, device_name="Test GPU", **shape)
    current = load_kernel_config_table("paged_attention_decode", device_name="Test GPU", **shape)
    tuned = {64: {"partition_size": 512, "num_threads": 256}, 256: {"partition_size": 1024, "num_threads": 64}}
    assert merged_table(current, tuned) == {1: old[1], **tuned}
    assert merged_table(None, tuned) == tuned  # no table in effect: this run's entries only
