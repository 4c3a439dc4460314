"""Volta mode against native mode on one GPU, in one run: the same benchmark twice.

    python benchmarks/benchmark_modes.py --volta-tree /tmp/volta-tree --benchmark throughput \\
        --config qwen2.5-1.5b --input-len 512 --output-len 256 --num-prompts 1000

Native: this tree's ops extension, no capability override. Volta: the tree given by
--volta-tree, whose ``vllm_volta/_C`` was built with TORCH_CUDA_ARCH_LIST="7.5+PTX" (V100
adapter + PTX), run with VLLM_VOLTA_DEVICE_CAPABILITY=7.0. Each side runs in a fresh process
(the GPU to itself); every other flag goes to the benchmark. "volta_vs_native" is Volta's
speed over native's (throughput ratio; inverse latency ratio), so >= 0.8 meets issue 5.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.utils import log, ratio, run_and_emit  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Higher-is-better keys compare volta/native; lower-is-better (latency) native/volta.
_FASTER_IS_HIGHER = {"throughput": ("requests_per_second", "output_tokens_per_second",
                                    "tokens_per_second")}
_FASTER_IS_LOWER = {"latency": ("avg_latency", "p50_latency", "decode_time_per_token")}


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="throughput", choices=["throughput", "latency"])
    parser.add_argument("--volta-tree", default=None,
                        help="copy of this repo with a 7.5+PTX build of vllm_volta/_C "
                             "(default: this tree, i.e. only the capability override)")
    parser.add_argument("--output-json", default=None, help="also write the JSON here")
    args, rest = parser.parse_known_args(argv)
    tree = Path(args.volta_tree) if args.volta_tree else ROOT
    if not (tree / "benchmarks" / f"benchmark_{args.benchmark}.py").is_file():
        raise ValueError(f"--volta-tree {tree} has no benchmarks/benchmark_{args.benchmark}.py")
    args.volta_tree = str(tree.resolve())
    return args, rest


def run_side(tree: str, benchmark: str, bench_args: list[str], volta: bool) -> dict[str, Any]:
    """One benchmark process; its stdout is the JSON, its stderr passes through."""
    env = dict(os.environ)
    env.pop("VLLM_VOLTA_DEVICE_CAPABILITY", None)
    if volta:
        env["VLLM_VOLTA_DEVICE_CAPABILITY"] = "7.0"
    cmd = [sys.executable, str(Path(tree) / "benchmarks" / f"benchmark_{benchmark}.py"),
           *bench_args]
    log(f"{'volta' if volta else 'native'}: {' '.join(cmd)}")
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{'volta' if volta else 'native'} run failed "
                           f"(exit {proc.returncode}); its stderr is above")
    return json.loads(proc.stdout)


def headline(result: dict[str, Any]) -> str:
    """One side's main figures in a line (the log's last lines then hold a run's result)."""
    parts = [f"{key} {result[key]:.6g}" for key in ("output_tokens_per_second", "decode_time_per_token")
             if isinstance(result.get(key), (int, float))]
    fraction = (result.get("roofline") or {}).get("fraction_of_roofline")
    if fraction is not None:
        parts.append(f"{fraction:.1%} of roofline")
    vs_hf = (result.get("ratio_vs_hf") or {}).get("output_tokens_per_second")
    if vs_hf is not None:
        parts.append(f"{vs_hf:.2f}x transformers")
    return ", ".join(parts)


def run(args: argparse.Namespace, bench_args: list[str]) -> dict[str, Any]:
    native = run_side(str(ROOT), args.benchmark, bench_args, volta=False)
    volta = run_side(args.volta_tree, args.benchmark, bench_args, volta=True)
    speed = {k: ratio(volta[k], native[k])
             for k in _FASTER_IS_HIGHER.get(args.benchmark, ())}
    speed.update({k: ratio(native[k], volta[k]) if volta.get(k) else None
                  for k in _FASTER_IS_LOWER.get(args.benchmark, ())})
    log(f"summary: native {headline(native)}; volta {headline(volta)}; volta vs native: "
        + ", ".join(f"{k} {v:.3f}" for k, v in speed.items() if v is not None))
    adapter = volta["device"].get("extension", {}).get("v100_adapter")
    if not adapter:
        log("warning: the Volta side's extension is not a V100-adapter build "
            "(build --volta-tree with TORCH_CUDA_ARCH_LIST='7.5+PTX')")
    return {"benchmark": f"modes/{args.benchmark}", "benchmark_args": bench_args,
            "volta_tree": args.volta_tree, "volta_extension_is_adapter": adapter,
            "volta_vs_native": speed, "native": native, "volta": volta}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args, bench_args = parse_args(argv)
    return run_and_emit(lambda: run(args, bench_args), args.output_json)


if __name__ == "__main__":
    main()
