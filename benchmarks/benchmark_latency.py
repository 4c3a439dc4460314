"""Latency of one batch end to end: --batch-size prompts of --input-len, --output-len tokens each.

    python benchmarks/benchmark_latency.py --config llama-3-8b --dtype half --batch-size 1 \\
        --input-len 128 --output-len 512 --roofline --compare-hf

Each iteration uses fresh random prompts (so prefix caching cannot skip the prefill). Besides
vLLM's avg_latency / latencies / percentiles it times a prefill-only pass (one output token)
to get the decode time per token, and with --roofline compares the bytes a mean decode step
moves per second (weights, the active experts only; the KV cache read; a recurrent state read and
written: decode_bytes.py) to the device-to-device copy bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.backends import iter_runners, offline_result  # noqa: E402
from benchmarks.decode_bytes import decode_bytes_per_step  # noqa: E402
from benchmarks.cli_args import (add_backend_args, add_model_args, check_positive,  # noqa: E402
                                 finalize_model_args)
from benchmarks.utils import (default_device, log,  # noqa: E402
                              measure_copy_bandwidth, parse_dtype, random_token_prompts, run_and_emit,
                              summarize, timed, weight_bytes_per_token)

_PERCENTILES = (10, 25, 50, 75, 90, 99)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    add_backend_args(parser)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-iters", type=int, default=30)
    parser.add_argument("--num-iters-warmup", type=int, default=10)
    parser.add_argument("--roofline", action="store_true",
                        help="report decode's achieved fraction of the memory roofline")
    parser.add_argument("--copy-bytes", type=int, default=1 << 30,
                        help="size of the copy that measures device bandwidth (--roofline)")
    parser.add_argument("--output-json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    check_positive(args, "batch_size", "input_len", "output_len", "num_iters")
    if args.num_iters_warmup < 0:
        raise ValueError(f"--num-iters-warmup must be >= 0, got {args.num_iters_warmup}")
    finalize_model_args(args)
    return args


class _Prompts:
    """Fresh prompts per iteration, identical across backends (seeded by iteration index)."""

    def __init__(self, args: argparse.Namespace, vocab_size: int) -> None:
        self.args, self.vocab_size, self.calls = args, vocab_size, 0

    def reset(self) -> None:
        self.calls = 0

    def next(self) -> list[list[int]]:
        self.calls += 1
        return random_token_prompts(self.args.batch_size, self.args.input_len,
                                    self.vocab_size, self.args.seed * 100_003 + self.calls)


def _time_iters(runner: Any, prompts: _Prompts, output_len: int, iters: int) -> list[float]:
    latencies = []
    for _ in range(iters):
        batch = prompts.next()
        with timed(runner.device) as t:
            lens = runner.generate(batch, output_len)
        if sum(lens) != len(batch) * output_len:
            raise RuntimeError(f"{runner.name} generated {sum(lens)} tokens, "
                               f"expected {len(batch)} x {output_len}")
        latencies.append(t["elapsed"])
    return latencies


def measure(runner: Any, args: argparse.Namespace, prompts: _Prompts) -> dict[str, Any]:
    """Warm-up, timed full runs, timed prefill-only runs -> latency and decode figures."""
    prompts.reset()
    log(f"{runner.name}: {args.num_iters_warmup} warm-up iterations")
    _time_iters(runner, prompts, args.output_len, args.num_iters_warmup)
    log(f"{runner.name}: {args.num_iters} timed iterations")
    latencies = _time_iters(runner, prompts, args.output_len, args.num_iters)
    prefill = _time_iters(runner, prompts, 1, args.num_iters)
    stats = summarize(latencies, _PERCENTILES)
    prefill_p50 = summarize(prefill, (50,))["p50"]
    out: dict[str, Any] = {
        "dtype": str(runner.dtype).removeprefix("torch."),
        "avg_latency": stats["mean"],
        "latencies": latencies,
        "percentiles": {str(p): stats[f"p{p}"] for p in _PERCENTILES},
        "p50_latency": stats["p50"],
        "p90_latency": stats["p90"],
        "p99_latency": stats["p99"],
        "prefill_latency_p50": prefill_p50,
    }
    if args.output_len > 1:
        # One decode step per token after the first: (full - prefill) / (output_len - 1).
        per_token = max(stats["p50"] - prefill_p50, 0.0) / (args.output_len - 1)
        out["decode_time_per_token"] = per_token
        if per_token > 0:
            out["decode_steps_per_second"] = 1.0 / per_token
            out["decode_tokens_per_second"] = args.batch_size / per_token
    log(f"{runner.name}: p50 {stats['p50'] * 1e3:.2f} ms, "
        f"decode {out.get('decode_time_per_token', 0) * 1e3:.3f} ms/token")
    return out


def roofline(result: dict[str, Any], step_bytes: float, copy_bw: float) -> dict[str, Any]:
    """Bytes a decode step moves (decode_bytes.py: weights, KV cache, recurrent state), per
    second, as a fraction of the copy bandwidth."""
    steps = result.get("decode_steps_per_second")
    achieved = steps * step_bytes if steps else None
    return {"achieved_bandwidth_bytes_per_s": achieved,
            "fraction_of_roofline": achieved / copy_bw if achieved else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(args.model)
    copy = None
    if args.roofline:
        # Measured before any model exists, while the device memory is free for a big copy.
        copy = measure_copy_bandwidth(default_device(), args.copy_bytes)
        log(f"copy bandwidth {copy['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
    prompts = _Prompts(args, hf_config.vocab_size)
    results: dict[str, dict[str, Any]] = {}
    for runner in iter_runners(args, hf_config, args.batch_size):
        results[runner.name] = measure(runner, args, prompts)

    result = offline_result("latency", args, results, batch_size=args.batch_size,
                            input_len=args.input_len, output_len=args.output_len,
                            num_iters=args.num_iters)
    if copy is not None:
        primary = results[args.backend]
        dtype = parse_dtype(primary["dtype"])
        step = decode_bytes_per_step(hf_config, dtype, args.batch_size, args.input_len, args.output_len)
        result["roofline"] = {
            "copy_bandwidth_bytes_per_s": copy["bandwidth_bytes_per_s"],
            "copy_bandwidth_counts": "bytes read + bytes written",
            **weight_bytes_per_token(hf_config, dtype),
            **step,
        }
        for res in results.values():
            res["roofline"] = roofline(res, step["bytes_per_step"], copy["bandwidth_bytes_per_s"])
        result["roofline"].update(primary["roofline"])
    if "vllm-volta" in results and "hf" in results:
        ours, hf = results["vllm-volta"], results["hf"]
        result["speedup_vs_hf"] = {
            key: hf[key] / ours[key] if ours.get(key) and hf.get(key) else None
            for key in ("avg_latency", "p50_latency", "decode_time_per_token")
        }
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
