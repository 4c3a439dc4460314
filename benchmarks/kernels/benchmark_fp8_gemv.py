"""FP8 weights kept in FP8 (the SM70 kernels of layers/quantization/fp8_sm70.py: fp8_gemv up to 8
rows, the fp8_gemm tensor-core GEMM up to 128, fp8_dequantize + cuBLAS above) against a float16
cuBLAS GEMM of the same shape.

    python benchmarks/kernels/benchmark_fp8_gemv.py --config qwen3-8b-fp8 --rows 1 4 8 16 64 256
    VLLM_VOLTA_DEVICE_CAPABILITY=7.0 python benchmarks/kernels/benchmark_fp8_gemv.py   # Volta mode

For each projection of a decoder layer (qkv, o, gate_up, down: Qwen3-8B's 6144x4096, 4096x4096,
24576x4096 and 4096x12288 by default) and each row count M, one CUDA graph runs the product over
enough distinct weights to exceed the L2 cache (DRAM-bound, as in a decode step). Block scales
128x128, float32, one per row and 128 inputs (fp8.py's layout). Prints one JSON document:
microseconds per call, weight bytes read per second (FP8: the bytes plus the scales; float16: two
bytes a weight) and that as a fraction of the device-to-device copy bandwidth measured in the same
run, and per M the whole layer's sum and the FP8 speedup over float16. ``fp8_sm70`` is the layers'
automatic choice; up to 8 rows ``fp8_gemv_r{2,4,8}`` time the GEMV at each rows_per_block (8: up to 2
input rows; the automatic choice is 8 there, else 4); above 8 rows ``fp8_gemm`` and
``fp8_dequant_cublas`` are both timed (where the layers switch from one to the other:
fp8_sm70.GEMM_MAX_ROWS). On an SM89+ GPU the W8A8 Triton GEMM
(what those GPUs run for checkpoints with FP8 activations) is timed too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: the repository root replaces the script's folder
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.kernels.benchmark_gemv import layer_shapes  # noqa: E402
from benchmarks.kernels.kernel_timing import graph_replay_seconds, num_arg_sets  # noqa: E402
from benchmarks.utils import (device_info, log, measure_copy_bandwidth, require_cuda, resolve_model,  # noqa: E402
                              run_and_emit)

GROUP = 128  # Qwen3-FP8's weight_block_size


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-8b-fp8", help="shipped config name or a config.json path")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 64, 256], help="input rows M")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if not all(m >= 1 for m in args.rows):
        raise ValueError(f"--rows must be >= 1, got {args.rows}")
    return args


def fp8_weight(n: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A random FP8 weight [N, K] and its block scales as fp8.py holds them: [N, ceil(K / 128)]."""
    w = torch.empty(n, k, device=device).uniform_(-448.0, 448.0).to(torch.float8_e4m3fn)
    blocks = torch.rand(-(-n // GROUP), -(-k // GROUP), device=device) * 1e-4
    return w, blocks.repeat_interleave(GROUP, 0)[:n].contiguous()


def w8a8_available(device: torch.device) -> bool:
    if torch.cuda.get_device_capability(device) < (8, 9):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_fp8_gemv.py")
    from vllm_volta import _custom_ops as ops
    from vllm_volta.model_executor.layers.quantization.fp8_sm70 import fp8_w8a16_linear, sm70_kernels_reason

    why_not = sm70_kernels_reason(device, torch.float16)
    if why_not is not None:
        raise RuntimeError(f"the FP8 SM70 kernels cannot run here: {why_not}")
    config = json.loads((Path(resolve_model(None, args.config)) / "config.json").read_text())
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}")
    with_w8a8 = w8a8_available(device)
    results, layer = [], {}
    for name, (n, k) in layer_shapes(config).items():
        fp8_bytes = n * k + n * -(-k // GROUP) * 4
        fp16_bytes = n * k * 2
        fp8_sets = [fp8_weight(n, k, device) for _ in range(num_arg_sets(fp8_bytes))]
        fp16_sets = [torch.randn(n, k, dtype=torch.float16, device=device) for _ in range(num_arg_sets(fp16_bytes))]
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.float16, device=device)
            impls: dict[str, tuple[int, list[Callable[[], Any]]]] = {
                "cublas_fp16": (fp16_bytes, [lambda w=w: F.linear(x, w) for w in fp16_sets]),
                "fp8_sm70": (fp8_bytes, [lambda w=w, s=s: fp8_w8a16_linear(x, w, s, GROUP, None)
                                         for w, s in fp8_sets]),
            }
            out = torch.empty(m, n, dtype=torch.float16, device=device)
            if m <= 8:
                for rows in (2, 4, 8) if m <= 2 else (2, 4):
                    impls[f"fp8_gemv_r{rows}"] = (fp8_bytes, [
                        lambda w=w, s=s, rows=rows: ops.fp8_gemv(out, x, w, s, GROUP, None, rows) for w, s in fp8_sets])
            else:
                def dequant_cublas(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
                    dense = torch.empty(n, k, dtype=torch.float16, device=device)
                    ops.fp8_dequantize(dense, w, s, GROUP)
                    return F.linear(x, dense)

                impls["fp8_gemm"] = (fp8_bytes, [lambda w=w, s=s: ops.fp8_gemm(out, x, w, s, GROUP)
                                                 for w, s in fp8_sets])
                impls["fp8_dequant_cublas"] = (fp8_bytes, [lambda w=w, s=s: dequant_cublas(w, s)
                                                           for w, s in fp8_sets])
            if with_w8a8:
                from vllm_volta.model_executor.layers.quantization.fp8_kernels import w8a8_block_fp8_linear
                impls["w8a8_triton"] = (fp8_bytes, [lambda w=w, s=s: w8a8_block_fp8_linear(x, w, s, (GROUP, GROUP))
                                                    for w, s in fp8_sets])
            for impl, (nbytes, calls) in impls.items():
                seconds = graph_replay_seconds(lambda calls=calls: [call() for call in calls], device,
                                               replays=5) / len(calls)
                rate = nbytes / seconds
                results.append({"proj": name, "n": n, "k": k, "m": m, "impl": impl, "us": seconds * 1e6,
                                "weight_bytes": nbytes, "gb_per_s": rate / 1e9,
                                "fraction_of_copy_bandwidth": rate / copy_bw})
                log(f"{name:>8} {n:>6}x{k:<6} M={m:<4} {impl:>12}: {seconds * 1e6:8.2f} us "
                    f"{rate / 1e9:7.0f} GB/s {rate / copy_bw:6.1%}")
                layer.setdefault(m, {}).setdefault(impl, 0.0)
                layer[m][impl] += seconds * 1e6
        del fp8_sets, fp16_sets
    per_layer = []
    for m, t in layer.items():
        row = {"m": m, **{f"{impl}_us": us for impl, us in t.items()},
               "fp8_sm70_speedup_vs_fp16": t["cublas_fp16"] / t["fp8_sm70"]}
        if "w8a8_triton" in t:
            row["w8a8_triton_speedup_vs_fp16"] = t["cublas_fp16"] / t["w8a8_triton"]
        per_layer.append(row)
        log(f"layer M={m:<4} fp8_sm70 {row['fp8_sm70_speedup_vs_fp16']:.2f}x float16 cuBLAS")
    return {"benchmark": "kernels/fp8_gemv", "config": args.config, "group": GROUP, "device_info": device_info(),
            "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_counts": "bytes read + bytes written",
            "results": results, "per_layer": per_layer}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
