"""Decode GEMVs: the _C gemv kernel against cuBLAS (F.linear) on a model's projection shapes.

    python benchmarks/kernels/benchmark_gemv.py --config llama-3-8b --batch-sizes 1 2 4

For each projection of a decoder layer (qkv, o, gate_up, down) and each batch size M, one
CUDA graph runs the product over enough distinct weight matrices to exceed the L2 cache
(DRAM-bound, like a decode step), for cuBLAS and for gemv at each rows_per_block. Prints one
JSON document: microseconds per call, the fraction of the device-to-device copy bandwidth
measured in the same run (weight bytes / time), and per M the whole layer's sum for cuBLAS and
for gemv's automatic launch. `launch_split`: the largest projection at M = 1 as 1, 2, 4, 8 and
16 gemv launches over slices of its rows (the same bytes, more kernel boundaries), and the time
each extra launch adds (the slope from 1 to 16). Float16 only (gemv's dtype).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.kernels.kernel_timing import graph_replay_seconds, num_arg_sets  # noqa: E402
from benchmarks.utils import (device_info, log, measure_copy_bandwidth, require_cuda, resolve_model,  # noqa: E402
                              run_and_emit)

ROWS_PER_BLOCK = (0, 2, 4, 8)  # 0: the kernel's automatic choice
LAUNCH_SPLITS = (1, 2, 4, 8, 16)


def layer_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(N, K) of each decoder-layer projection, from a Hugging Face config.json."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    return {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
            "gate_up": (2 * inter, hidden), "down": (hidden, inter)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="llama-3-8b", help="shipped config name or a config.json path")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if not all(1 <= m <= 4 for m in args.batch_sizes):
        raise ValueError(f"--batch-sizes must be in 1..4 (gemv's range), got {args.batch_sizes}")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_gemv.py")
    from vllm_volta import _custom_ops as ops

    config = json.loads((Path(resolve_model(None, args.config)) / "config.json").read_text())
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}")
    results, layer = [], {}
    for name, (n, k) in layer_shapes(config).items():
        nbytes = n * k * 2
        weights = [torch.randn(n, k, dtype=torch.float16, device=device) for _ in range(num_arg_sets(nbytes))]
        for m in args.batch_sizes:
            x = torch.randn(m, k, dtype=torch.float16, device=device)
            out = torch.empty(m, n, dtype=torch.float16, device=device)
            impls: dict[str, list[Callable[[], Any]]] = {
                "cublas": [lambda w=w: F.linear(x, w) for w in weights]}
            for rows in ROWS_PER_BLOCK:
                impls[f"gemv_r{rows}"] = [lambda w=w, rows=rows: ops.gemv(out, x, w, None, rows) for w in weights]
            for impl, calls in impls.items():
                seconds = graph_replay_seconds(lambda: [call() for call in calls], device, replays=5) / len(calls)
                frac = nbytes / seconds / copy_bw
                results.append({"proj": name, "n": n, "k": k, "m": m, "impl": impl, "us": seconds * 1e6,
                                "fraction_of_copy_bandwidth": frac})
                log(f"{name:>8} {n:>6}x{k:<6} M={m} {impl:>8}: {seconds * 1e6:7.2f} us {frac:6.1%}")
                if impl in ("cublas", "gemv_r0"):
                    layer.setdefault(m, {}).setdefault(impl, 0.0)
                    layer[m][impl] += seconds * 1e6
        del weights
    per_layer = [{"m": m, "cublas_us": t["cublas"], "gemv_us": t["gemv_r0"],
                  "gemv_speedup": t["cublas"] / t["gemv_r0"]} for m, t in layer.items()]
    return {"benchmark": "kernels/gemv", "config": args.config, "device_info": device_info(),
            "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_counts": "bytes read + bytes written",
            "results": results, "per_layer": per_layer, "launch_split": launch_split(config, device)}


def row_slices(n: int, pieces: int) -> list[slice]:
    """`pieces` consecutive slices of range(n), as equal as possible (none empty)."""
    if not 1 <= pieces <= n:
        raise ValueError(f"pieces must be in 1..{n}, got {pieces}")
    bounds = [n * i // pieces for i in range(pieces + 1)]
    return [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def launch_split(config: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The largest projection at M = 1 as 1..16 gemv launches over row slices: what a kernel
    boundary between decode GEMVs costs (its launch, the first loads' latency, the tail)."""
    from vllm_volta import _custom_ops as ops

    name, (n, k) = max(layer_shapes(config).items(), key=lambda item: item[1][0] * item[1][1])
    weights = [torch.randn(n, k, dtype=torch.float16, device=device) for _ in range(num_arg_sets(n * k * 2))]
    x = torch.randn(1, k, dtype=torch.float16, device=device)
    out = torch.empty(1, n, dtype=torch.float16, device=device)
    us = {}
    for pieces in LAUNCH_SPLITS:
        calls = [lambda w=w, rows=rows: ops.gemv(out[:, rows], x, w[rows]) for w in weights
                 for rows in row_slices(n, pieces)]
        us[pieces] = graph_replay_seconds(lambda: [call() for call in calls], device, replays=5) / len(weights) * 1e6
        log(f"{name} {n}x{k} M=1 as {pieces:>2} launches: {us[pieces]:7.2f} us")
    first, last = LAUNCH_SPLITS[0], LAUNCH_SPLITS[-1]
    return {"proj": name, "n": n, "k": k, "us_by_launches": us,
            "us_per_extra_launch": (us[last] - us[first]) / (last - first)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
