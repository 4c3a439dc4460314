"""Bandwidth of the paged-attention decode kernel (torch.ops._C.paged_attention_decode).

    python benchmarks/kernels/benchmark_paged_attention.py --batch-size 64 --context-len 4096 \\
        --num-kv-heads 8 --num-heads 32 --head-size 128 --dtype half --kv-cache-dtype auto fp8

--kv-cache-dtype takes one or more of auto (the cache in --dtype), fp8 / fp8_e4m3, fp8_e5m2: each
is timed on the same shape and launch, and FP8 runs report their speedup over auto.

Every sequence has --context-len cached tokens spread over random blocks; one decode step reads
the whole K and V context once. Bytes per call = K + V context (+ queries and outputs);
achieved bandwidth is compared with the device-to-device copy bandwidth measured in the same
run. Launch parameters: --partition-size / --num-threads, else the tuned kernel config for this
shape and device (vllm_volta/kernel_configs.py), else the backend's default. Target (issue 5):
>= 75% of copy bandwidth at batch 64 x context 4096 x 8 KV heads x head dim 128, fp16.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.kernels.kernel_timing import time_per_call_graphed  # noqa: E402
from benchmarks.utils import device_info, log, measure_copy_bandwidth, parse_dtype, require_cuda, run_and_emit  # noqa: E402
from vllm_volta import _custom_ops as ops  # noqa: E402
from vllm_volta.attention.kv_cache_dtype import KV_CACHE_DTYPES, kv_cache_torch_dtype  # noqa: E402
from vllm_volta.attention.backends.paged_decode_launch import context_bucket, default_launch_config  # noqa: E402

TARGET_FRACTION = 0.75


def add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context-len", type=int, default=4096)
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="the kernel's grid bound (default: --context-len); the engine's CUDA graphs "
                        "pass max_model_len, so a short context runs in a grid sized for a long one")
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="half")
    p.add_argument("--iters", type=int, default=50)


def check_shape_args(args: argparse.Namespace) -> None:
    for name in ("context_len", "num_heads", "num_kv_heads", "head_size", "block_size", "iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_seq_len is None:
        args.max_seq_len = args.context_len
    if args.max_seq_len < args.context_len:
        raise ValueError(f"--max-seq-len ({args.max_seq_len}) must be >= --context-len ({args.context_len})")
    if args.num_heads % args.num_kv_heads:
        raise ValueError(f"--num-heads ({args.num_heads}) must be a multiple of --num-kv-heads ({args.num_kv_heads})")


def make_decode_inputs(args: argparse.Namespace, batch_size: int, device: torch.device) -> dict[str, Any]:
    """Cache, block table, lengths, queries for `batch_size` sequences of --context-len tokens."""
    dtype = parse_dtype(args.dtype)
    blocks_per_seq = math.ceil(args.context_len / args.block_size)
    num_blocks = batch_size * blocks_per_seq + 1
    kv_cache = torch.randn(2, num_blocks, args.block_size, args.num_kv_heads, args.head_size,
                           dtype=dtype, device=device)
    cache_dtype = _cache_dtype(args)
    if cache_dtype != dtype:  # an FP8 cache: the values as the cache write would round them
        kv_cache = kv_cache.to(cache_dtype)
    table = torch.zeros(batch_size, math.ceil(args.max_seq_len / args.block_size), dtype=torch.int32,
                        device=device)
    used = torch.randperm(num_blocks - 1, device=device)[: batch_size * blocks_per_seq] + 1
    table[:, :blocks_per_seq] = used.view(batch_size, blocks_per_seq).to(torch.int32)
    return dict(
        kv_cache=kv_cache,
        block_table=table,
        seq_lens=torch.full((batch_size,), args.context_len, dtype=torch.int32, device=device),
        query=torch.randn(batch_size, args.num_heads, args.head_size, dtype=dtype, device=device),
        out=torch.empty(batch_size, args.num_heads, args.head_size, dtype=dtype, device=device),
    )


def _cache_dtype(args: argparse.Namespace) -> torch.dtype:
    """The cache's dtype for this run (``args.kv_cache_dtype``: one value; "auto" when unset)."""
    return kv_cache_torch_dtype(getattr(args, "kv_cache_dtype", "auto"), parse_dtype(args.dtype))


def bytes_per_call(args: argparse.Namespace, batch_size: int) -> int:
    """Bytes a call must move: the keys / values it attends (the last --sliding-window tokens with
    a window) and the queries / outputs."""
    elt = parse_dtype(args.dtype).itemsize
    tokens = min(args.context_len, getattr(args, "sliding_window", None) or args.context_len)
    kv = 2 * batch_size * tokens * args.num_kv_heads * args.head_size * _cache_dtype(args).itemsize
    return kv + 2 * batch_size * args.num_heads * args.head_size * elt


def time_decode(inputs: dict[str, Any], args: argparse.Namespace, launch: dict[str, int],
                device: torch.device) -> float:
    """Seconds per decode call with the given launch parameters (GPU time: CUDA-graph replay,
    as the engine runs decode)."""
    def call() -> None:
        ops.paged_attention_decode(inputs["out"], inputs["query"], inputs["kv_cache"], inputs["block_table"],
                                   inputs["seq_lens"], 1.0 / math.sqrt(args.head_size), args.max_seq_len,
                                   launch["partition_size"], launch["num_threads"],
                                   getattr(args, "sliding_window", None), getattr(args, "logits_soft_cap", None),
                                   k_scale=1.0, v_scale=1.0)

    return time_per_call_graphed(call, device, iters=args.iters)


def launch_config(args: argparse.Namespace, device: torch.device) -> tuple[dict[str, int], str]:
    """--partition-size / --num-threads (the other one from the default), else the tuned table's
    entry for the nearest batch size and context (the grid's span, bucketed as VOLTA_PAGED does),
    else the backend's default for this device."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    span = context_bucket(min(args.max_seq_len, args.sliding_window or args.max_seq_len))
    default = default_launch_config(args.batch_size, args.num_heads, args.num_kv_heads, sms, span)
    if args.partition_size is not None or args.num_threads is not None:
        return {"partition_size": args.partition_size or default["partition_size"],
                "num_threads": args.num_threads or default["num_threads"]}, "command line"
    from vllm_volta.kernel_configs import get_kernel_config, load_kernel_config_entries

    shape = dict(head_size=args.head_size, num_kv_heads=args.num_kv_heads, dtype=parse_dtype(args.dtype))
    if not load_kernel_config_entries("paged_attention_decode", **shape):
        return default, "default (no tuned table for this device)"
    cfg = get_kernel_config("paged_attention_decode", args.batch_size, default=default, context_len=span, **shape)
    return {k: int(cfg[k]) for k in default}, f"tuned (batch {args.batch_size}, context {span})"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=64)
    add_shape_args(p)
    p.add_argument("--partition-size", type=int, default=None)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--sliding-window", type=int, default=None,
                   help="attend to the last N tokens only (Mistral, Gemma 2 / 3 layers)")
    p.add_argument("--logits-soft-cap", type=float, default=None, help="attention-logit soft cap (Gemma 2)")
    p.add_argument("--kv-cache-dtype", nargs="+", default=["auto"], choices=KV_CACHE_DTYPES,
                   help="cache element types to time side by side (auto: --dtype; FP8 runs also report "
                        "their speedup over auto)")
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    check_shape_args(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Times each --kv-cache-dtype on the same shape and launch; the JSON's top-level figures are
    the first one's, ``runs`` has every one (FP8: ``speedup_vs_auto`` when auto ran too)."""
    device = require_cuda("benchmark_paged_attention")
    copy_bw = measure_copy_bandwidth(device, args.copy_bytes)["bandwidth_bytes_per_s"]
    launch, source = launch_config(args, device)
    runs = []
    for kv_dtype in dict.fromkeys(args.kv_cache_dtype):
        one = argparse.Namespace(**{**vars(args), "kv_cache_dtype": kv_dtype})
        inputs = make_decode_inputs(one, args.batch_size, device)
        seconds = time_decode(inputs, one, launch, device)
        del inputs
        nbytes = bytes_per_call(one, args.batch_size)
        runs.append({"kv_cache_dtype": kv_dtype, "seconds_per_call": seconds, "bytes_per_call": nbytes,
                     "bandwidth_bytes_per_s": nbytes / seconds, "fraction_of_copy_bandwidth": nbytes / seconds / copy_bw})
    auto = next((r["seconds_per_call"] for r in runs if r["kv_cache_dtype"] == "auto"), None)
    for r in runs:
        if auto is not None and r["kv_cache_dtype"] != "auto":
            r["speedup_vs_auto"] = auto / r["seconds_per_call"]
        log(f"paged decode, KV cache {r['kv_cache_dtype']}: {r['seconds_per_call'] * 1e6:.1f} us, "
            f"{r['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s = {r['fraction_of_copy_bandwidth']:.1%} of copy "
            f"({copy_bw / 1e9:.0f} GB/s), launch {launch} ({source})"
            + (f", {r['speedup_vs_auto']:.2f}x auto's speed" if "speedup_vs_auto" in r else ""))
    seconds, nbytes, bw = runs[0]["seconds_per_call"], runs[0]["bytes_per_call"], runs[0]["bandwidth_bytes_per_s"]
    return {"benchmark": "kernels/paged_attention_decode", "device_info": device_info(),
            "batch_size": args.batch_size, "context_len": args.context_len, "max_seq_len": args.max_seq_len,
            "num_heads": args.num_heads,
            "num_kv_heads": args.num_kv_heads, "head_size": args.head_size, "block_size": args.block_size,
            "dtype": args.dtype, "sliding_window": args.sliding_window,
            "logits_soft_cap": args.logits_soft_cap, "launch_config": launch, "launch_config_source": source,
            "seconds_per_call": seconds, "bytes_per_call": nbytes, "bandwidth_bytes_per_s": bw,
            "copy_bandwidth_bytes_per_s": copy_bw, "fraction_of_copy_bandwidth": bw / copy_bw,
            "target_met": bw / copy_bw >= TARGET_FRACTION, "kv_cache_dtype": runs[0]["kv_cache_dtype"],
            "runs": runs}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
