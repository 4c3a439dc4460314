"""The sampler's kernels: gumbel_sample (random rows) and greedy_sample (argmax rows).

    python benchmarks/kernels/benchmark_sampling.py --num-rows 1000 --vocab-size 151936 --dtype half

Each call reads a [rows, vocab] logits tensor once (several tensors in rotation, more than the
L2 cache holds, as a decode step's fresh logits). Prints one JSON document: microseconds per
call, logits bytes read over time, and its fraction of the device-to-device copy bandwidth
measured in the same run. The default shape is a decode step of the offline throughput
benchmark (1000 rows, Qwen2.5's vocabulary).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.kernels.kernel_timing import num_arg_sets, time_per_call  # noqa: E402
from benchmarks.utils import (device_info, log, measure_copy_bandwidth, parse_dtype, require_cuda,  # noqa: E402
                              run_and_emit)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-rows", type=int, default=1000)
    p.add_argument("--vocab-size", type=int, default=151936)
    p.add_argument("--dtype", default="half")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    for name in ("num_rows", "vocab_size", "iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    parse_dtype(args.dtype)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_sampling.py")
    from vllm_volta import _custom_ops as ops

    dtype = parse_dtype(args.dtype)
    rows, vocab = args.num_rows, args.vocab_size
    nbytes = rows * vocab * dtype.itemsize
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}")
    logits = [torch.randn(rows, vocab, dtype=dtype, device=device) for _ in range(num_arg_sets(nbytes))]
    sampled = torch.empty(rows, dtype=torch.int64, device=device)
    temperature = torch.ones(rows, dtype=torch.float32, device=device)
    seeds = torch.randint(-(2 ** 62), 2 ** 62, (rows,), device=device)
    kernels = {"gumbel_sample": lambda x: ops.gumbel_sample(sampled, x, temperature, seeds),
               "greedy_sample": lambda x: ops.greedy_sample(sampled, x)}
    results = []
    for name, fn in kernels.items():
        seconds = time_per_call(fn, [(x,) for x in logits], device, iters=args.iters)
        frac = nbytes / seconds / copy_bw
        results.append({"op": name, "us": seconds * 1e6, "read_bytes": nbytes,
                        "fraction_of_copy_bandwidth": frac})
        log(f"{name:>14} {rows} x {vocab} {args.dtype}: {seconds * 1e6:8.1f} us, {frac:6.1%} of copy")
    return {"benchmark": "kernels/sampling", "num_rows": rows, "vocab_size": vocab, "dtype": args.dtype,
            "device_info": device_info(), "copy_bandwidth_bytes_per_s": copy_bw,
            "copy_bandwidth_counts": "bytes read + bytes written", "results": results}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
