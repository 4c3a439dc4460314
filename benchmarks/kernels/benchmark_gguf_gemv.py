"""GGUF weights kept in their blocks (layers/quantization/gguf.py: gguf_gemv up to 8 rows,
gguf_dequantize + cuBLAS above) against a float16 cuBLAS GEMM of the same shape.

    python benchmarks/kernels/benchmark_gguf_gemv.py --config llama-3-8b --rows 1 4 8
    python benchmarks/kernels/benchmark_gguf_gemv.py --rows 1 4 8 64 --types Q4_K Q6_K

For each projection of a decoder layer (Llama-3-8B: qkv 6144x4096, o 4096x4096, gate_up
28672x4096, down 4096x14336), each GGUF type and each row count M, one CUDA graph runs the
product over enough distinct weights to exceed the L2 cache (DRAM-bound, as in a decode step).
Prints one JSON document: microseconds per call, GB/s of the block bytes read (float16: two bytes
a weight) and that as a fraction of the device-to-device copy bandwidth measured in the same run;
per M the decoder layer's sum per type, and a Q4_K_M layer (q / k / o / gate / up in Q4_K, v and
down in Q6_K: llama.cpp's heavier choice for the layers that get it) against float16.
Above 8 rows, ``pytorch_dequant_cublas`` also times the PyTorch dequantizer on the GPU + cuBLAS
(eager: it is not graph-capturable), the alternative to the CUDA dequantize kernels.
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
from gguf import GGMLQuantizationType  # noqa: E402

from benchmarks.kernels.benchmark_gemv import layer_shapes  # noqa: E402
from benchmarks.kernels.kernel_timing import graph_replay_seconds, num_arg_sets, time_per_call  # noqa: E402
from benchmarks.utils import (device_info, log, measure_copy_bandwidth, require_cuda, resolve_model,  # noqa: E402
                              run_and_emit)

TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Q4_K_M: the type of each projection (q / k / v parts of qkv; v and down take Q6_K).
Q4_K_M = {"qkv": ("Q4_K", "Q6_K"), "o": ("Q4_K",), "gate_up": ("Q4_K",), "down": ("Q6_K",)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="llama-3-8b", help="shipped config name or a config.json path")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8], help="input rows M")
    p.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES, help="GGUF block types")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if not all(m >= 1 for m in args.rows):
        raise ValueError(f"--rows must be >= 1, got {args.rows}")
    return args


def random_parts(types: Sequence[str], row_splits: Sequence[int], k: int, device: torch.device) -> list[Any]:
    """A layer's parts (gguf_parts.Part) of random blocks: rows row_splits[i] in types[i]."""
    from vllm_volta.model_executor.layers.quantization.gguf_parts import Part, pack
    from vllm_volta.model_executor.model_loader.gguf_blocks import row_bytes

    parts, row0 = [], 0
    for name, rows in zip(types, row_splits):
        qtype = GGMLQuantizationType[name]
        blocks = torch.randint(0, 256, (rows, row_bytes(qtype, k)), dtype=torch.uint8, device=device)
        parts.append(Part(qtype, row0, rows, blocks))
        row0 += rows
    pack(parts)
    return parts


def _time(calls: list[Callable[[], Any]], device: torch.device) -> float:
    return graph_replay_seconds(lambda: [call() for call in calls], device, replays=5) / len(calls)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_gguf_gemv.py")
    from vllm_volta.model_executor.layers.quantization.gguf import gguf_linear, kernels_reason
    from vllm_volta.model_executor.model_loader.gguf_dequant import dequantize

    why_not = kernels_reason(device, torch.float16)
    if why_not is not None:
        raise RuntimeError(f"the GGUF kernels cannot run here: {why_not}")
    hf = json.loads((Path(resolve_model(None, args.config)) / "config.json").read_text())
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    v_rows = hf.get("num_key_value_heads", hf["num_attention_heads"]) * head_dim
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}")
    results, layer = [], {}
    for proj, (n, k) in layer_shapes(hf).items():
        layouts = {name: ((name,), (n,)) for name in args.types}
        mix = Q4_K_M[proj]
        layouts["Q4_K_M"] = (mix, (n - v_rows, v_rows) if len(mix) == 2 else (n,))
        fp16_sets = [torch.randn(n, k, dtype=torch.float16, device=device) for _ in range(num_arg_sets(n * k * 2))]
        for layout, (types, splits) in layouts.items():
            probe = random_parts(types, splits, k, device)
            nbytes = sum(p.blocks.numel() for p in probe)
            sets = [probe] + [random_parts(types, splits, k, device) for _ in range(num_arg_sets(nbytes) - 1)]
            for m in args.rows:
                x = torch.randn(m, k, dtype=torch.float16, device=device)
                impls: dict[str, tuple[int, float]] = {
                    "gguf": (nbytes, _time([lambda parts=parts: gguf_linear(x, parts, n, None) for parts in sets],
                                           device))}
                if layout == args.types[0]:  # the float16 baseline once per projection and M
                    impls["cublas_fp16"] = (n * k * 2, _time([lambda w=w: F.linear(x, w) for w in fp16_sets], device))
                if m > 8 and len(types) == 1:
                    qtype = GGMLQuantizationType[types[0]]
                    torch_path = [(lambda parts=parts: F.linear(x, dequantize(parts[0].blocks, qtype, (n, k)).half()))
                                  for parts in sets]
                    impls["pytorch_dequant_cublas"] = (nbytes, time_per_call(lambda c: c(), [(c,) for c in torch_path],
                                                                             device, iters=len(torch_path)))
                for impl, (read, seconds) in impls.items():
                    name = layout if impl == "gguf" else impl if impl == "cublas_fp16" else f"{layout}:{impl}"
                    rate = read / seconds
                    results.append({"proj": proj, "n": n, "k": k, "m": m, "impl": name, "us": seconds * 1e6,
                                    "weight_bytes": read, "gb_per_s": rate / 1e9,
                                    "fraction_of_copy_bandwidth": rate / copy_bw})
                    log(f"{proj:>8} {n:>6}x{k:<6} M={m:<4} {name:>28}: {seconds * 1e6:8.2f} us "
                        f"{rate / 1e9:7.0f} GB/s {rate / copy_bw:6.1%}")
                    layer.setdefault(m, {}).setdefault(name, 0.0)
                    layer[m][name] += seconds * 1e6
            del sets, probe
        del fp16_sets
    per_layer = []
    for m, t in layer.items():
        row = {"m": m, **{f"{impl}_us": us for impl, us in t.items()}}
        for layout in (*args.types, "Q4_K_M"):
            row[f"{layout}_speedup_vs_fp16"] = t["cublas_fp16"] / t[layout]
        per_layer.append(row)
        log(f"layer M={m:<4} Q4_K_M {row['Q4_K_M_speedup_vs_fp16']:.2f}x float16 cuBLAS")
    return {"benchmark": "kernels/gguf_gemv", "config": args.config, "device_info": device_info(),
            "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_counts": "bytes read + bytes written",
            "results": results, "per_layer": per_layer}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
