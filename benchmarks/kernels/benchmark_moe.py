"""The mixture-of-experts layer (routing + experts) on a GPU, and the tuner of its launch parameters.

    python benchmarks/kernels/benchmark_moe.py --shape qwen3-30b-a3b --batch-sizes 1 2 4 8 16 64 256
    python benchmarks/kernels/benchmark_moe.py --shape mixtral --tune [--output-dir DIR]

Per batch size T: one MoE layer of the shape with random (dummy) weights, timed as CUDA-graph
replays (no launch overhead) of the layer's forward on several inputs in turn, each routed to
different experts (so the chosen experts' weights come from DRAM, not L2). `device_us`: the
device path (topk_softmax, then the decode GEMVs or the grouped GEMM, as the layer picks them);
`host_grouped_us`: the layer's host-grouped path (eager, a host sync per call) for comparison.
`selected_bytes`: the weights the step must read (the router, plus gate/up/down of every expert
some token chose, counted once); `bandwidth_gbs` = selected_bytes / device time, and its fraction
of the device-to-device copy bandwidth measured in the same run.

--tune times every candidate (gemv at rows_per_block 2, 4, 8; grouped GEMM at block_size 16, 32,
64 for 16-bit dtypes; the host-grouped loop, eagerly, which CUDA graphs replace by the device path)
per batch size and writes the fastest as the kernel config the layer looks
up (vllm_volta/kernel_configs.py: op=fused_moe, keyed by num_experts, top_k, hidden_size,
intermediate_size, dtype and device) to --output-dir, else VLLM_VOLTA_KERNEL_CONFIG_DIR, else the
shipped folder. Prints one JSON document.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.kernels.kernel_timing import time_per_call, time_per_call_graphed  # noqa: E402
from benchmarks.utils import (device_info, log, measure_copy_bandwidth, parse_dtype, require_cuda,  # noqa: E402
                              run_and_emit)

# (num_experts, top_k, hidden_size, moe intermediate size, renormalize)
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, True), "mixtral": (8, 2, 4096, 14336, True)}
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
INPUT_SETS = 8  # inputs per graph, each routed anew


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--num-experts", type=int, help="override the shape's")
    p.add_argument("--top-k", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--intermediate-size", type=int)
    p.add_argument("--dtype", default="half")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--iters", type=int, default=20, help="graph replays of the input sets per timing")
    p.add_argument("--no-host", action="store_true", help="skip timing the host-grouped path")
    p.add_argument("--tune", action="store_true")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batch_sizes):
        raise ValueError(f"--batch-sizes must all be >= 1, got {args.batch_sizes}")
    if args.iters < 1:
        raise ValueError(f"--iters must be >= 1, got {args.iters}")
    e, k, h, i, _ = SHAPES[args.shape]
    args.num_experts = args.num_experts or e
    args.top_k = args.top_k or k
    args.hidden_size = args.hidden_size or h
    args.intermediate_size = args.intermediate_size or i
    if not 1 <= args.top_k <= args.num_experts:
        raise ValueError(f"--top-k must be in [1, {args.num_experts}], got {args.top_k}")
    return args


def make_layer(args: argparse.Namespace, dtype: torch.dtype, device: torch.device):
    from vllm_volta.model_executor.layers.moe import MoE
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            moe = MoE(args.num_experts, args.top_k, args.hidden_size, args.intermediate_size, renormalize=True)
    finally:
        torch.set_default_dtype(prev)
    for p in moe.parameters():
        p.data.normal_(0, args.hidden_size ** -0.5)
    reason = moe.device_path_reason()
    if reason is not None:
        raise SystemExit(f"benchmark_moe: the device path cannot run: {reason}")
    return moe


def selected_bytes(moe, xs: list[torch.Tensor]) -> float:
    """Average over the inputs of the bytes one forward must read: router + the chosen experts."""
    per_expert = (moe.w13[0].numel() + moe.w2[0].numel()) * moe.w13.element_size()
    router = moe.gate.weight.numel() * moe.gate.weight.element_size()
    total = 0
    for x in xs:
        ids, _ = moe.route(x)
        total += router + per_expert * ids.unique().numel()
    return total / len(xs)


def graphed_seconds(fn: Callable[..., Any], arg_sets: list[tuple], device: torch.device, iters: int) -> float:
    """GPU seconds per call of fn(*args), the calls cycling through arg_sets inside one graph."""
    state = {"i": 0}

    def call() -> None:
        fn(*arg_sets[state["i"] % len(arg_sets)])
        state["i"] += 1

    return time_per_call_graphed(call, device, iters=iters * len(arg_sets))


def tune_batch(moe, xs: list[torch.Tensor], device: torch.device, iters: int) -> tuple[dict[str, Any], list]:
    """The fastest launch parameters for these inputs, and every candidate's time."""
    from vllm_volta.model_executor.layers.fused_moe import fused_experts
    candidates: list[dict[str, Any]] = [{"path": "gemv", "rows_per_block": r} for r in (2, 4, 8)]
    if moe.w13.dtype != torch.float32:
        candidates += [{"path": "gemm", "block_size": b} for b in (16, 32, 64)]
    arg_sets = [(x, *reversed(moe.route(x))) for x in xs]  # (x, weights, ids)
    results = []
    for config in candidates:
        def experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, config=config) -> torch.Tensor:
            return fused_experts(x, moe.w13, moe.w2, weights, ids, config)
        results.append((graphed_seconds(experts, arg_sets, device, iters), config))
    # The host-grouped loop syncs every call: timed eagerly, as the steps that would use it run.
    host = time_per_call(lambda x, weights, ids: moe._forward_host_grouped(x, ids, weights.to(x.dtype)),
                         arg_sets, device, iters=iters * len(arg_sets))
    results.append((host, {"path": "host"}))
    best = min(results, key=lambda r: r[0])[1]
    return best, [{"config": c, "us": s * 1e6} for s, c in results]


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_moe")
    dtype = parse_dtype(args.dtype)
    moe = make_layer(args, dtype, device)
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    rows, tuned = [], {}
    for t in args.batch_sizes:
        gen = torch.Generator(device=device).manual_seed(t)
        xs = [torch.randn(t, args.hidden_size, generator=gen, device=device).to(dtype) for _ in range(INPUT_SETS)]
        nbytes = selected_bytes(moe, xs)
        seconds = graphed_seconds(moe, [(x,) for x in xs], device, args.iters)
        row: dict[str, Any] = {"batch_size": t, "device_us": seconds * 1e6, "selected_bytes": nbytes,
                               "bandwidth_gbs": nbytes / seconds / 1e9,
                               "fraction_of_copy_bw": nbytes / seconds / copy_bw,
                               "config": moe._kernel_config(t, dtype)}
        if not args.no_host:
            ids_weights = [moe.route(x) for x in xs]
            host = time_per_call(lambda x, iw: moe._forward_host_grouped(x, iw[0], iw[1].to(dtype)),
                                 list(zip(xs, ids_weights)), device, iters=args.iters * len(xs))
            row["host_grouped_us"] = host * 1e6
        if args.tune:
            best, candidates = tune_batch(moe, xs, device, args.iters)
            tuned[t] = best
            row["tuned"] = {"best": best, "candidates": candidates}
        log(f"T={t}: {row['device_us']:.1f} us, {row['bandwidth_gbs']:.0f} GB/s")
        rows.append(row)
    result: dict[str, Any] = {"shape": {"num_experts": args.num_experts, "top_k": args.top_k,
                                        "hidden_size": args.hidden_size,
                                        "intermediate_size": args.intermediate_size,
                                        "dtype": str(dtype).removeprefix("torch.")},
                              "copy_bandwidth_gbs": copy_bw / 1e9, "results": rows, "device": device_info()}
    if args.tune:
        from vllm_volta.kernel_configs import write_kernel_config
        path = write_kernel_config("fused_moe", tuned, device_name=torch.cuda.get_device_name(device),
                                   directory=args.output_dir, **moe.kernel_config_shape(dtype))
        result["config_file"] = str(path)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
