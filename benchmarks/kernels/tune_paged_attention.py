"""Tune the paged-attention decode launch (partition_size, num_threads) per batch size and write
the kernel-config JSON that VOLTA_PAGED looks up (vllm_volta/kernel_configs.py).

    python benchmarks/kernels/tune_paged_attention.py --num-heads 32 --num-kv-heads 8 \\
        --head-size 128 --dtype half --context-len 4096 [--max-seq-len 8192] [--output-dir DIR]

Every candidate is timed on the GPU (CUDA-graph replay, so launch overhead is not counted) for
each batch size; the fastest is kept. --max-seq-len sizes the grid as the engine's decode graphs
do (max_model_len), which matters for short contexts. The file goes to
--output-dir, else VLLM_VOLTA_KERNEL_CONFIG_DIR, else the shipped vllm_volta/kernel_configs/,
named by op, head_size, num_kv_heads, dtype and device; it holds the batch sizes of this run,
plus with --merge the other entries of the table in effect (to retune some batch sizes, e.g.
small ones at a short context, and keep the rest). Prints one JSON document.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.kernels.benchmark_paged_attention import (add_shape_args, bytes_per_call,  # noqa: E402
                                                          check_shape_args, make_decode_inputs, time_decode)
from benchmarks.utils import device_info, log, parse_dtype, require_cuda, run_and_emit  # noqa: E402
from vllm_volta.kernel_configs import load_kernel_config_table, write_kernel_config  # noqa: E402

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # 1024: max_num_seqs on >= 70 GiB GPUs
PARTITION_SIZES = (32, 64, 128, 256, 512, 1024)
NUM_THREADS = (64, 128, 192, 256, 512)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--output-dir", default=None)
    p.add_argument("--merge", action="store_true",
                   help="keep the entries of the table in effect (user folder, else shipped) for the "
                        "batch sizes not tuned in this run")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    check_shape_args(args)
    if any(b < 1 for b in args.batch_sizes):
        raise ValueError(f"--batch-sizes must all be >= 1, got {args.batch_sizes}")
    return args


def merged_table(current: dict[int, dict[str, int]] | None,
                 tuned: dict[int, dict[str, int]]) -> dict[int, dict[str, int]]:
    """`tuned` over `current`: the batch sizes tuned now take their new entries, the others keep theirs."""
    return {**(current or {}), **tuned}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("tune_paged_attention")
    best: dict[int, dict[str, int]] = {}
    results = []
    for batch in args.batch_sizes:
        inputs = make_decode_inputs(args, batch, device)
        timings = {}
        for partition, threads in itertools.product(PARTITION_SIZES, NUM_THREADS):
            launch = {"partition_size": partition, "num_threads": threads}
            timings[(partition, threads)] = time_decode(inputs, args, launch, device)
        (partition, threads), seconds = min(timings.items(), key=lambda kv: kv[1])
        best[batch] = {"partition_size": partition, "num_threads": threads}
        bw = bytes_per_call(args, batch) / seconds
        results.append({"batch_size": batch, **best[batch], "seconds_per_call": seconds,
                        "bandwidth_bytes_per_s": bw})
        log(f"batch {batch:>4}: partition {partition:>4} threads {threads:>3}: {seconds * 1e6:8.1f} us "
            f"{bw / 1e9:6.0f} GB/s")
        del inputs
    shape = dict(head_size=args.head_size, num_kv_heads=args.num_kv_heads, dtype=parse_dtype(args.dtype))
    if args.merge:
        best = merged_table(load_kernel_config_table("paged_attention_decode", **shape), best)
    path = write_kernel_config("paged_attention_decode", best, directory=args.output_dir, **shape)
    return {"benchmark": "kernels/tune_paged_attention", "device_info": device_info(),
            "context_len": args.context_len, "max_seq_len": args.max_seq_len, "num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads,
            "head_size": args.head_size, "dtype": args.dtype, "config_file": str(path), "results": results}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
