"""Bandwidth of the _C norm/activation ops, native CUDA kernel vs the V100 adapter.

    python benchmarks/kernels/benchmark_ops.py --num-tokens 4096 --hidden-size 4096 --dtype half

For each op it times `torch.ops._C` (the native kernel; the adapter in a V100-adapter build)
and `torch.ops._C_adapter` (always the adapter), and prints one JSON document with the bytes
each call must move (reads + writes), the achieved bandwidth, and its fraction of the
device-to-device copy bandwidth measured in the same run. For *_and_mul, --hidden-size is
the output width d (input [num_tokens, 2 * d]). Target (issue 2): native rms_norm and
silu_and_mul >= 80% of copy bandwidth at 4096 x 4096 fp16.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import vllm_volta._C as ext  # noqa: E402
import vllm_volta._custom_ops  # noqa: E402,F401
from benchmarks.kernels.kernel_timing import num_arg_sets, time_per_call  # noqa: E402
from benchmarks.utils import (default_device, device_info, log, measure_copy_bandwidth,  # noqa: E402
                              parse_dtype, run_and_emit)

OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
TARGET_FRACTION = 0.8
TARGET_OPS = ("rms_norm", "silu_and_mul")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-tokens", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=4096)
    p.add_argument("--dtype", default="half")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    for name in ("num_tokens", "hidden_size", "iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def bytes_per_call(op: str, t: int, h: int, dtype: torch.dtype) -> int:
    """Bytes one call must read + write (the weight vector is negligible)."""
    tensors = {"rms_norm": 2, "fused_add_rms_norm": 4}.get(op, 3)  # *_and_mul: 2h in, h out
    return tensors * t * h * torch.empty((), dtype=dtype).element_size()


def make_args(op: str, t: int, h: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """One argument set for `op` on [t, h] activations."""
    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=device)

    if op == "rms_norm":
        return torch.empty(t, h, dtype=dtype, device=device), rand(t, h), rand(h), 1e-6
    if op == "fused_add_rms_norm":
        return rand(t, h), rand(t, h), rand(h), 1e-6
    return torch.empty(t, h, dtype=dtype, device=device), rand(t, 2 * h)


def implementations() -> dict[str, Any]:
    """label -> op namespace. A V100-adapter build has no native kernel to measure; on a
    CPU build both namespaces run the same adapter code, so one is enough."""
    if not ext.BUILT_WITH_CUDA:
        return {"cpu": torch.ops._C}
    impls = {"adapter": torch.ops._C_adapter}
    if not ext.V100_ADAPTER:
        impls["native"] = torch.ops._C
    return impls


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = default_device()
    dtype = parse_dtype(args.dtype)
    copy = measure_copy_bandwidth(device, args.copy_bytes)
    copy_bw = copy["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}")
    results = []
    for op in args.ops:
        nbytes = bytes_per_call(op, args.num_tokens, args.hidden_size, dtype)
        sets = [make_args(op, args.num_tokens, args.hidden_size, dtype, device)
                for _ in range(num_arg_sets(nbytes))]
        for label, ns in implementations().items():
            seconds = time_per_call(getattr(ns, op), sets, device, iters=args.iters)
            bw = nbytes / seconds
            results.append({"op": op, "impl": label, "seconds_per_call": seconds,
                            "bytes_per_call": nbytes, "bandwidth_bytes_per_s": bw,
                            "fraction_of_copy_bandwidth": bw / copy_bw})
            log(f"{op:>18} {label:>8}: {seconds * 1e6:8.1f} us  {bw / 1e9:7.0f} GB/s  {bw / copy_bw:5.1%}")
        del sets
    targets = {f"{r['op']} native >= {TARGET_FRACTION:.0%} of copy": r["fraction_of_copy_bandwidth"] >= TARGET_FRACTION
               for r in results if r["impl"] == "native" and r["op"] in TARGET_OPS}
    return {"benchmark": "kernels/ops", "device_info": device_info(), "dtype": str(dtype).split(".")[-1],
            "num_tokens": args.num_tokens, "hidden_size": args.hidden_size,
            "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_counts": "bytes read + bytes written",
            "results": results, "targets_met": targets}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
