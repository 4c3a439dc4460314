"""Timing of single kernels for the benchmarks and tuners in benchmarks/kernels/.

Each call cycles through several independent argument sets whose total size is well
above the GPU's L2 cache, so a memory-bound kernel is measured against DRAM, as the
copy bandwidth it is compared to (benchmarks.utils.measure_copy_bandwidth) is.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

# Several times the largest L2 of the GPUs we target (H100/H200: 50-60 MB).
DEFAULT_WORKING_SET_BYTES = 512 << 20


def num_arg_sets(bytes_per_call: int, working_set_bytes: int = DEFAULT_WORKING_SET_BYTES,
                 max_sets: int = 64) -> int:
    """How many argument sets to rotate through so their total reaches the working set."""
    if bytes_per_call <= 0:
        raise ValueError(f"bytes_per_call must be > 0, got {bytes_per_call}")
    return max(1, min(max_sets, math.ceil(working_set_bytes / bytes_per_call)))


def time_per_call(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], device: torch.device,
                  *, iters: int = 50, warmup: int = 5) -> float:
    """Seconds per call of fn(*args), args cycling through arg_sets (CUDA events on a GPU)."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for i in range(iters):
            fn(*arg_sets[i % len(arg_sets)])
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    begin = time.perf_counter()
    for i in range(iters):
        fn(*arg_sets[i % len(arg_sets)])
    return (time.perf_counter() - begin) / iters


def graph_replay_seconds(work: Callable[[], Any], device: torch.device, *, replays: int = 3) -> float:
    """GPU seconds per replay of one CUDA graph holding work()'s launches. The graph is captured
    the way vllm_volta's engine would (driver_graph.choose_capture_path): from a process's fourth
    torch.cuda.CUDAGraph capture on, every kernel node replays ~0.45 us slower on the H200, which
    a benchmark capturing one graph per configuration would add to microsecond kernels."""
    from vllm_volta.worker.driver_graph import capture_graph, choose_capture_path

    with torch.cuda.device(device):
        graph, _, _ = capture_graph(work, choose_capture_path()[0])
    graph.replay()  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / replays


def time_per_call_graphed(fn: Callable[[], Any], device: torch.device, *, iters: int = 50) -> float:
    """Seconds per call of fn() on the GPU alone: `iters` calls captured in one CUDA graph and
    replayed, so host launch overhead (which dominates microsecond kernels) is not counted.
    Falls back to time_per_call off CUDA."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if device.type != "cuda":
        return time_per_call(fn, [()], device, iters=iters)

    def calls() -> None:
        for _ in range(iters):
            fn()

    return graph_replay_seconds(calls, device) / iters
