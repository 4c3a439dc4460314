"""One quantized mixture-of-experts layer (4-bit AWQ-style experts, group 128, or FP8 block 128x128)
on a GPU, in float16.

    python benchmarks/kernels/benchmark_moe_quant.py --shape qwen3-30b-a3b --batch-sizes 1 2 4 8 16 64

Per batch size T: the layer's forward (routing + experts: the moe_w4 GEMVs up to 8 tokens, the
gathered or chunk-dequantized experts above, as fused_moe_quant.py picks them) timed as CUDA-graph
replays over several inputs, each routed anew (the chosen experts come from DRAM, not L2).
`selected_bytes`: the router plus the packed gate/up/down (and scales) of every expert some token
chose, counted once; `bandwidth_gbs` = selected_bytes / time and its fraction of the measured
device-to-device copy bandwidth. Prints one JSON document.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.kernels.benchmark_moe import INPUT_SETS, SHAPES, graphed_seconds  # noqa: E402
from benchmarks.utils import device_info, log, measure_copy_bandwidth, require_cuda, run_and_emit  # noqa: E402

FORMATS = {"awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
           "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--format", choices=sorted(FORMATS), default="awq")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    p.add_argument("--iters", type=int, default=20, help="graph replays of the input sets per timing")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batch_sizes):
        raise ValueError(f"--batch-sizes must all be >= 1, got {args.batch_sizes}")
    if args.iters < 1:
        raise ValueError(f"--iters must be >= 1, got {args.iters}")
    return args


def make_layer(args: argparse.Namespace, device: torch.device):
    from types import SimpleNamespace

    from vllm_volta.model_executor.layers.moe import MoE
    from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
    from vllm_volta.model_executor.model_loader.dummy import initialize_dummy_weights

    e, k, h, i, renormalize = SHAPES[args.shape]
    config = get_quant_config(SimpleNamespace(quantization_config=FORMATS[args.format]))
    torch.set_default_dtype(torch.float16)
    try:
        with quantization(config), torch.device(device):
            moe = MoE(e, k, h, i, renormalize=renormalize)
    finally:
        torch.set_default_dtype(torch.float32)
    initialize_dummy_weights(moe)
    if moe.quant_method.kind == "w4":  # integer zero points (dummy floats are not)
        for sz in (moe.w13_sz, moe.w2_sz):
            sz.data[..., 1] = 8.0
            sz.data[..., 0] = 1e-3
    reason = moe.device_path_reason()
    if reason is not None:
        raise SystemExit(f"benchmark_moe_quant: the device path cannot run: {reason}")
    return moe


def selected_bytes(moe, xs: list[torch.Tensor]) -> float:
    names = moe.quant_method.param_names()
    per_expert = sum(getattr(moe, n)[0].numel() * getattr(moe, n).element_size() for n in names)
    router = moe.gate.weight.numel() * moe.gate.weight.element_size()
    return sum(router + per_expert * moe.route(x)[0].unique().numel() for x in xs) / len(xs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_moe_quant")
    moe = make_layer(args, device)
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    rows = []
    for t in args.batch_sizes:
        gen = torch.Generator(device=device).manual_seed(t)
        xs = [torch.randn(t, moe.gate.input_size, generator=gen, device=device).half() for _ in range(INPUT_SETS)]
        moe(xs[0])  # first call: logs the path, warms the allocator outside the capture
        seconds = graphed_seconds(lambda x: moe(x), [(x,) for x in xs], device, args.iters)
        nbytes = selected_bytes(moe, xs)
        rows.append({"batch_size": t, "us": seconds * 1e6, "selected_bytes": nbytes,
                     "bandwidth_gbs": nbytes / seconds / 1e9, "fraction_of_copy_bandwidth": nbytes / seconds / copy_bw})
        log(f"T={t}: {seconds * 1e6:.1f} us, {nbytes / seconds / 1e9:.0f} GB/s")
    return {"benchmark": "moe_quant", "shape": args.shape, "format": args.format, "device": device_info(),
            "copy_bandwidth_gbs": copy_bw / 1e9, "results": rows}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
