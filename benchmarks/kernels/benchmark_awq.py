"""4-bit (AWQ / GPTQ) linear layers: the W4A16 kernels against the AWQ-layout path and float16 cuBLAS.

    python benchmarks/kernels/benchmark_awq.py                       # Llama-3-8B shapes, group 128
    python benchmarks/kernels/benchmark_awq.py --tune                # + writes w4a16_linear configs

For each projection of a Llama-3-8B decoder layer (qkv 4096->6144, o 4096->4096, gate_up
4096->28672, down 14336->4096) and each row count M, one CUDA graph runs the product over enough
distinct weights to exceed the L2 cache (DRAM-bound, like a model step) for:
- ``w4``: the launch w4_linear.py picks for M (a tuned w4a16_linear file, else the default);
- ``awq``: the AWQ-layout path (awq_gemv up to 4 rows, else awq_dequantize + cuBLAS);
- ``fp16``: a float16 cuBLAS GEMM (F.linear) of the same shape.
Prints one JSON document: microseconds per call, the weight bytes each read (4-bit values plus
scales / zeros; float16) as GB/s and as a fraction of the device-to-device copy bandwidth measured
in the same run, and the speedups over fp16 and awq; per M the whole layer's sums.

``--tune`` times every valid launch (gemv rows_per_warp; gemm block_m x block_n x splits; dense)
per shape and M, keeps the fastest and writes it with kernel_configs.write_kernel_config (to
VLLM_VOLTA_KERNEL_CONFIG_DIR when set, else the shipped folder), merged into the existing table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.kernels.kernel_timing import graph_replay_seconds, num_arg_sets  # noqa: E402
from benchmarks.utils import device_info, log, measure_copy_bandwidth, require_cuda, run_and_emit  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}  # (K, N)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 2048)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="input rows M")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--tune", action="store_true", help="time every launch and write w4a16_linear configs")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if any(m < 1 for m in args.rows):
        raise ValueError(f"--rows must be positive, got {args.rows}")
    return args


def candidates(m: int) -> list[dict[str, Any]]:
    """Every launch the tuner tries for M rows (w4_linear.check_config accepts each)."""
    out: list[dict[str, Any]] = []
    if m <= 8:
        out += [{"kernel": "gemv", "rows_per_warp": r} for r in (1, 2, 4) if m <= 4 or r <= 2]
    # FP32 partials cost splits x M x N x 4 bytes: long inputs take few splits
    splits = (1, 2, 4, 8) if m <= 64 else (1, 2) if m <= 256 else (1,)
    if m >= 2:  # the GEMM pads to 16 rows; from a few rows it can beat gemv's x reads
        for bm in (16, 32, 64):
            if bm > 16 and bm >= 2 * m:  # a taller tile than the rows only wastes work
                continue
            for bn in (32, 64, 128):
                if (bm, bn) == (16, 32):
                    continue
                out += [{"kernel": "gemm", "block_m": bm, "block_n": bn, "splits": s} for s in splits]
    if m >= 64:
        out.append({"kernel": "dense"})
    return out


class Case:
    """One shape's argument sets: AWQ-layout tensors, their K-major repacking, float16 weights."""

    def __init__(self, k: int, n: int, group: int, device: torch.device) -> None:
        from vllm_volta.model_executor.layers.quantization.w4_layout import repack_awq
        from vllm_volta.model_executor.layers.quantization.w4_linear import W4Weights

        self.k, self.n, self.group = k, n, group
        groups = k // group
        self.w4_bytes = n * k // 2 + n * groups * 4
        self.awq_bytes = n * k // 2 + groups * n * 5 // 2
        self.fp16_bytes = n * k * 2
        gen = torch.Generator(device).manual_seed(0)

        def rand_int(*shape: int) -> torch.Tensor:
            return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device=device, generator=gen)

        self.awq, self.w4 = [], []
        for _ in range(num_arg_sets(self.w4_bytes)):
            qweight, qzeros = rand_int(k, n // 8), rand_int(groups, n // 8)
            scales = (torch.rand(groups, n, device=device, generator=gen) * 0.01).half()
            self.awq.append((qweight, qzeros, scales))
            self.w4.append(W4Weights(*repack_awq(qweight, qzeros, scales), group))
        self.fp16 = [torch.randn(n, k, dtype=torch.float16, device=device, generator=gen) * 0.01
                     for _ in range(num_arg_sets(self.fp16_bytes))]

    def seconds(self, calls: list[Callable[[], Any]], device: torch.device) -> float:
        return graph_replay_seconds(lambda: [call() for call in calls], device, replays=5) / len(calls)

    def time_w4(self, x: torch.Tensor, config: dict[str, Any] | None, device: torch.device) -> float:
        from vllm_volta.model_executor.layers.quantization.w4_linear import w4_matmul

        return self.seconds([lambda w=w: w4_matmul(x, w, None, config) for w in self.w4], device)

    def time_awq(self, x: torch.Tensor, device: torch.device) -> float:
        from vllm_volta.model_executor.layers.quantization.awq import awq_matmul

        return self.seconds([lambda t=t: awq_matmul(x, *t, self.group, None) for t in self.awq], device)

    def time_fp16(self, x: torch.Tensor, device: torch.device) -> float:
        return self.seconds([lambda w=w: F.linear(x, w) for w in self.fp16], device)


def tune(case: Case, rows: Sequence[int], device: torch.device) -> dict[int, dict[str, Any]]:
    """The fastest launch per M (ties: the earlier candidate)."""
    best: dict[int, dict[str, Any]] = {}
    for m in rows:
        x = torch.randn(m, case.k, dtype=torch.float16, device=device)
        timed = [(case.time_w4(x, cfg, device), i, cfg) for i, cfg in enumerate(candidates(m))]
        seconds, _, config = min(timed)
        best[m] = config
        log(f"tune K={case.k} N={case.n} M={m}: {config} {seconds * 1e6:.2f} us ({len(timed)} launches)")
    return best


def write_tuned(case: Case, table: dict[int, dict[str, Any]], device: torch.device) -> str:
    from vllm_volta.kernel_configs import load_kernel_config_table, write_kernel_config
    from vllm_volta.model_executor.layers.quantization.w4_linear import OP

    name = torch.cuda.get_device_name(device)
    shape = dict(n=case.n, k=case.k, group_size=case.group, dtype="float16")
    merged = dict(load_kernel_config_table(OP, device_name=name, **shape) or {})
    merged.update(table)
    return str(write_kernel_config(OP, merged, device_name=name, **shape))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_awq.py")
    from vllm_volta.model_executor.layers.quantization.w4_linear import choose_config

    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}")
    results, layer, written = [], {}, []
    for name in args.shapes:
        k, n = SHAPES[name]
        case = Case(k, n, args.group_size, device)
        if args.tune:
            written.append(write_tuned(case, tune(case, args.rows, device), device))
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.float16, device=device)
            config = choose_config(m, case.w4[0], device)
            us = {"w4": case.time_w4(x, config, device) * 1e6, "awq": case.time_awq(x, device) * 1e6,
                  "fp16": case.time_fp16(x, device) * 1e6}
            nbytes = {"w4": case.w4_bytes, "awq": case.awq_bytes, "fp16": case.fp16_bytes}
            row = {"proj": name, "k": k, "n": n, "m": m, "w4_config": config, "us": us,
                   "weight_gb_per_s": {i: nbytes[i] / us[i] / 1e3 for i in us},
                   "fraction_of_copy_bandwidth": {i: nbytes[i] / (us[i] * 1e-6) / copy_bw for i in us},
                   "w4_speedup_over_fp16": us["fp16"] / us["w4"], "w4_speedup_over_awq": us["awq"] / us["w4"]}
            results.append(row)
            log(f"{name:>8} {k:>5}->{n:<5} M={m:<4} w4 {us['w4']:8.2f} us ({row['fraction_of_copy_bandwidth']['w4']:5.1%})"
                f"  awq {us['awq']:8.2f}  fp16 {us['fp16']:8.2f}  x{row['w4_speedup_over_fp16']:.2f} vs fp16 "
                f"[{config['kernel']}]")
            totals = layer.setdefault(m, {"w4": 0.0, "awq": 0.0, "fp16": 0.0})
            for impl in totals:
                totals[impl] += us[impl]
        del case
        torch.cuda.empty_cache()
    per_layer = [{"m": m, "us": t, "w4_speedup_over_fp16": t["fp16"] / t["w4"],
                  "w4_speedup_over_awq": t["awq"] / t["w4"]} for m, t in layer.items()]
    return {"benchmark": "kernels/awq", "shapes": {s: SHAPES[s] for s in args.shapes}, "group_size": args.group_size,
            "device_info": device_info(), "copy_bandwidth_bytes_per_s": copy_bw,
            "copy_bandwidth_counts": "bytes read + bytes written", "results": results, "per_layer": per_layer,
            "tuned_files": written}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
