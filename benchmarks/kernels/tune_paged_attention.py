"""Tune the paged-attention decode launch (partition_size, num_threads) per batch size and context
length, and write the kernel-config JSON that VOLTA_PAGED looks up (vllm_volta/kernel_configs.py).

One layout:

    python benchmarks/kernels/tune_paged_attention.py --num-heads 32 --num-kv-heads 8 \\
        --head-size 128 --dtypes half [--batch-sizes 1 8 64] [--context-lens 4096 32768]

Every model layout of benchmarks/kernels/paged_attention_layouts.py (TP=1 and TP=2), both
dtypes, a few minutes of GPU time (few candidates, few iterations, a coarse grid):

    python benchmarks/kernels/tune_paged_attention.py --quick --layouts all --dtypes half bfloat16

Each (batch, context) point times every candidate on the GPU (CUDA-graph replay, so launch
overhead is not counted; the calls rotate over several caches that together exceed the L2, so
short contexts are read from DRAM, as in a model's decode step), with the grid spanning the
context (as the engine's lookups key on the span). Points whose KV cache exceeds
--max-cache-gib are skipped (the lookup takes the nearest tuned batch there). Files go to
--output-dir, else VLLM_VOLTA_KERNEL_CONFIG_DIR, else the shipped vllm_volta/kernel_configs/,
keyed "<batch>,<context>"; with --merge the other entries of the table in effect are kept.
Prints one JSON document.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.kernels.benchmark_paged_attention import make_decode_inputs  # noqa: E402
from benchmarks.kernels.kernel_timing import num_arg_sets, time_per_call_graphed  # noqa: E402
from benchmarks.kernels.paged_attention_layouts import Layout, resolve_layouts  # noqa: E402
from benchmarks.utils import device_info, log, parse_dtype, require_cuda, run_and_emit  # noqa: E402
from vllm_volta.attention.backends.paged_decode_launch import default_launch_config  # noqa: E402
from vllm_volta.kernel_configs import load_kernel_config_entries, write_kernel_config  # noqa: E402

OP = "paged_attention_decode"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT_LENS = (1024, 4096, 16384, 32768, 131072)
PARTITION_SIZES = (32, 64, 128, 256, 512, 1024)
NUM_THREADS = (64, 128, 192, 256, 512)
# --quick: a coarse grid and the candidates that won somewhere in full H200 sweeps.
QUICK_BATCH_SIZES = (1, 4, 8, 16, 64, 256)
QUICK_CONTEXT_LENS = (1024, 4096, 32768, 131072)
QUICK_CANDIDATES = ((128, 128), (256, 128), (512, 128), (512, 192), (1024, 192))
QUICK_ITERS = 10

Launch = dict[str, int]
Timer = Callable[[list[dict[str, Any]], argparse.Namespace, Launch, torch.device], float]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", nargs="+", default=None,
                   help="model layouts to tune (names from paged_attention_layouts.py, or 'all'); "
                        "else the one given by --num-heads / --num-kv-heads / --head-size")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2],
                   help="tensor-parallel sizes of --layouts (each rank holds 1/tp of the heads)")
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--dtypes", "--dtype", nargs="+", default=["half"], dest="dtypes")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    p.add_argument("--context-lens", "--context-len", type=int, nargs="+", default=None, dest="context_lens",
                   help="contexts to tune at; the grid spans each (the engine keys its lookups on the span: "
                        "max_seq_len, a CUDA graph's bound in graph mode)")
    p.add_argument("--max-cache-gib", type=float, default=16.0,
                   help="skip (batch, context) points whose K + V cache is larger")
    p.add_argument("--working-set-mib", type=int, default=512,
                   help="rotate the calls over caches of at least this much in total (beats the L2)")
    p.add_argument("--quick", action="store_true",
                   help=f"batches {QUICK_BATCH_SIZES}, contexts {QUICK_CONTEXT_LENS}, "
                        f"{len(QUICK_CANDIDATES)} candidates, {QUICK_ITERS} iterations")
    p.add_argument("--iters", type=int, default=None, help="calls per timing (default 50, --quick 10)")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--merge", action="store_true",
                   help="keep the entries of the table in effect (user folder, else shipped) for the "
                        "points not tuned in this run")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.batch_sizes is None:
        args.batch_sizes = list(QUICK_BATCH_SIZES if args.quick else BATCH_SIZES)
    if args.context_lens is None:
        args.context_lens = list(QUICK_CONTEXT_LENS if args.quick else CONTEXT_LENS)
    if args.iters is None:
        args.iters = QUICK_ITERS if args.quick else 50
    for name in ("batch_sizes", "context_lens", "tp"):
        if any(v < 1 for v in getattr(args, name)):
            raise ValueError(f"--{name.replace('_', '-')} must all be >= 1, got {getattr(args, name)}")
    for name in ("iters", "block_size", "working_set_mib"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_cache_gib <= 0:
        raise ValueError(f"--max-cache-gib must be > 0, got {args.max_cache_gib}")
    for dtype in args.dtypes:
        parse_dtype(dtype)  # a clear error naming the allowed values
    args.layout_list = (resolve_layouts(args.layouts, args.tp) if args.layouts is not None else
                        [Layout("command line", args.num_heads, args.num_kv_heads, args.head_size)])
    return args


def merged_table(current: dict[Any, dict[str, int]] | None,
                 tuned: dict[Any, dict[str, int]]) -> dict[Any, dict[str, int]]:
    """`tuned` over `current`: the points tuned now take their new entries, the others keep theirs."""
    return {**(current or {}), **tuned}


def candidates(args: argparse.Namespace, default: Launch) -> list[Launch]:
    """The launches to time at one point: all (or --quick's few) plus the untuned default."""
    pairs = QUICK_CANDIDATES if args.quick else tuple(itertools.product(PARTITION_SIZES, NUM_THREADS))
    out = [{"partition_size": p, "num_threads": t} for p, t in pairs]
    return out if default in out else out + [default]


def cache_bytes(layout: Layout, dtype: torch.dtype, batch: int, context: int) -> int:
    return 2 * batch * context * layout.num_kv_heads * layout.head_size * dtype.itemsize


def _point_args(args: argparse.Namespace, layout: Layout, dtype_name: str, context: int) -> argparse.Namespace:
    """The shape namespace benchmark_paged_attention's helpers read, for one point."""
    return argparse.Namespace(num_heads=layout.num_heads, num_kv_heads=layout.num_kv_heads,
                              head_size=layout.head_size, dtype=dtype_name, block_size=args.block_size,
                              context_len=context, max_seq_len=context, iters=args.iters,
                              sliding_window=None, logits_soft_cap=None)


def time_launch(input_sets: list[dict[str, Any]], shape: argparse.Namespace, launch: Launch,
                device: torch.device) -> float:
    """GPU seconds per decode call, the calls of one graph cycling through `input_sets`."""
    from vllm_volta import _custom_ops as ops

    calls = itertools.count()

    def call() -> None:
        inputs = input_sets[next(calls) % len(input_sets)]
        ops.paged_attention_decode(inputs["out"], inputs["query"], inputs["kv_cache"], inputs["block_table"],
                                   inputs["seq_lens"], 1.0 / math.sqrt(shape.head_size), shape.max_seq_len,
                                   launch["partition_size"], launch["num_threads"])

    return time_per_call_graphed(call, device, iters=shape.iters)


def tune_layout(args: argparse.Namespace, layout: Layout, dtype_name: str, device: torch.device,
                num_sms: int, timer: Timer = time_launch) -> tuple[dict[tuple[int, int], Launch], list[dict]]:
    """Best launch per (batch, context) of one layout and dtype, and the per-point results."""
    dtype = parse_dtype(dtype_name)
    best: dict[tuple[int, int], Launch] = {}
    results = []
    for context, batch in itertools.product(args.context_lens, args.batch_sizes):
        size = cache_bytes(layout, dtype, batch, context)
        if size > args.max_cache_gib * 2**30:
            results.append({"batch_size": batch, "context_len": context, "skipped": "cache above --max-cache-gib"})
            continue
        num_sets = num_arg_sets(size, args.working_set_mib << 20, max_sets=64)
        shape = _point_args(args, layout, dtype_name, context)
        # A graph of `iters` calls touches `iters` sets: at least one call per set, so a short
        # context is read from DRAM too.
        shape.iters = max(args.iters, num_sets)
        sets = [make_decode_inputs(shape, batch, device) for _ in range(num_sets)]
        default = default_launch_config(batch, layout.num_heads, layout.num_kv_heads, num_sms, context)
        timings = [(timer(sets, shape, launch, device), launch) for launch in candidates(args, default)]
        seconds, launch = min(timings, key=lambda t: t[0])
        default_seconds = next(s for s, c in timings if c == default)
        best[(batch, context)] = dict(launch)
        results.append({"batch_size": batch, "context_len": context, **launch, "seconds_per_call": seconds,
                        "bandwidth_bytes_per_s": size / seconds, "default_launch": default,
                        "default_over_best": default_seconds / seconds})
        log(f"{layout.name} {dtype_name} batch {batch:>4} context {context:>6}: partition "
            f"{launch['partition_size']:>4} threads {launch['num_threads']:>3}: {seconds * 1e6:9.1f} us "
            f"{size / seconds / 1e9:6.0f} GB/s (default {default_seconds / seconds:.2f}x)")
        del sets
    return best, results


def run(args: argparse.Namespace, timer: Timer = time_launch, device: torch.device | None = None,
        device_name: str | None = None) -> dict[str, Any]:
    if device is None:
        device = require_cuda("tune_paged_attention")
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    files = []
    for layout in args.layout_list:
        for dtype_name in args.dtypes:
            best, results = tune_layout(args, layout, dtype_name, device, num_sms, timer)
            shape = dict(head_size=layout.head_size, num_kv_heads=layout.num_kv_heads, dtype=parse_dtype(dtype_name))
            if not best:
                log(f"{layout.name} {dtype_name}: every point skipped (--max-cache-gib); no file written")
                files.append({"layout": layout.as_dict(), "dtype": dtype_name, "config_file": None,
                              "results": results})
                continue
            table: dict[Any, Launch] = dict(best)
            if args.merge:
                table = merged_table(load_kernel_config_entries(OP, device_name=device_name, **shape), table)
            path = write_kernel_config(OP, table, device_name=device_name, directory=args.output_dir, **shape)
            files.append({"layout": layout.as_dict(), "dtype": dtype_name, "config_file": str(path),
                          "results": results})
    return {"benchmark": "kernels/tune_paged_attention", "device_info": device_info(), "quick": args.quick,
            "iters": args.iters, "batch_sizes": args.batch_sizes, "context_lens": args.context_lens,
            "tables": files}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
