"""Offline throughput: N random token-id prompts of fixed input/output length, all at once.

    python benchmarks/benchmark_throughput.py --config qwen2.5-1.5b --input-len 512 \\
        --output-len 256 --num-prompts 1000 --compare-hf --hf-batch-size 256

Prints one JSON document (vLLM's fields: elapsed_time, num_requests, total_num_tokens,
requests_per_second, tokens_per_second, plus output_tokens_per_second) for the primary backend,
per-backend results under "results", and ours/transformers under "ratio_vs_hf".
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks import gpu_clocks  # noqa: E402
from benchmarks.backends import iter_runners, offline_result  # noqa: E402
from benchmarks.cli_args import (add_backend_args, add_model_args, check_positive,  # noqa: E402
                                 finalize_model_args)
from benchmarks.phase_timer import STEP_PHASES, StepRecord  # noqa: E402
from benchmarks.utils import log, random_token_prompts, ratio, run_and_emit, timed  # noqa: E402

_RATIO_KEYS = ("requests_per_second", "output_tokens_per_second", "tokens_per_second")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    add_backend_args(parser)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--hf-batch-size", type=int, default=64,
                        help="batch size of the transformers reference generate")
    parser.add_argument("--step-stats", action="store_true",
                        help="also report the engine's steps: how many ran prompt tokens "
                             "(prefill) or only decodes, their wall time and their host time "
                             "by phase (schedule, launch, wait for the device, finish)")
    parser.add_argument("--gpu-stats", action="store_true",
                        help="also report the GPU's SM clock, power draw and throttle reasons "
                             "during each timed run (sampled with nvidia-smi every 200 ms)")
    parser.add_argument("--output-json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    check_positive(args, "input_len", "output_len", "num_prompts", "hf_batch_size")
    if args.gpu_stats and not gpu_clocks.has_gpu():
        raise ValueError("--gpu-stats samples an NVIDIA GPU with nvidia-smi; there is no CUDA device here")
    finalize_model_args(args)
    return args


def throughput_metrics(elapsed: float, prompts: Sequence[Sequence[int]],
                       output_lens: Sequence[int]) -> dict[str, float]:
    """vLLM's throughput fields from one timed run; token counts are what was generated."""
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = sum(output_lens)
    return {
        "elapsed_time": elapsed,
        "num_requests": len(prompts),
        "total_prompt_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "total_num_tokens": prompt_tokens + output_tokens,
        "requests_per_second": len(prompts) / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
        "tokens_per_second": (prompt_tokens + output_tokens) / elapsed,
    }


def step_stats(steps: Sequence[StepRecord]) -> dict[str, dict[str, Any]]:
    """Count and wall time of the steps that ran prompt tokens and of the decode-only ones
    (mean, median, p90, max), their mean host time by phase (phase_timer.STEP_PHASES), and the
    garbage-collection pauses inside them."""
    out: dict[str, dict[str, Any]] = {}
    for name, prefill in (("prefill_steps", True), ("decode_steps", False)):
        kind = [(seconds, phases) for is_prefill, seconds, phases in steps if is_prefill == prefill]
        times = sorted(seconds for seconds, _ in kind)
        pauses = [ph["gc"] for _, ph in kind if ph.get("gc")]
        out[name] = {"count": len(times), "seconds": sum(times),
                     "ms_mean": 1e3 * statistics.fmean(times) if times else None,
                     "ms_median": 1e3 * statistics.median(times) if times else None,
                     "ms_p90": 1e3 * times[int(0.9 * (len(times) - 1))] if times else None,
                     "ms_max": 1e3 * times[-1] if times else None,
                     "host_ms_mean": {p: 1e3 * statistics.fmean(ph.get(p, 0.0) for _, ph in kind)
                                      for p in STEP_PHASES} if kind else None,
                     "gc": {"steps_with_collections": len(pauses),
                            "ms_total": 1e3 * sum(pauses), "ms_max": 1e3 * max(pauses, default=0.0)}}
    return out


def clock_sampler(args: argparse.Namespace, device: Any) -> Any:
    """A GpuClockSampler for `device` (None: the current CUDA device) with --gpu-stats, else a
    context that does nothing."""
    if not args.gpu_stats:
        return contextlib.nullcontext()
    return gpu_clocks.GpuClockSampler(gpu_clocks.nvidia_smi_id(device))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(args.model)
    prompts = random_token_prompts(args.num_prompts, args.input_len, hf_config.vocab_size,
                                   args.seed)
    # Prompts of their own: the engine's prefix cache would otherwise skip the prefill of timed
    # prompts the warm-up already ran.
    warmup = random_token_prompts(2, args.input_len, hf_config.vocab_size, args.seed + 1)
    results: dict[str, dict[str, Any]] = {}
    for runner in iter_runners(args, hf_config, args.hf_batch_size):
        # Warm-up (lazy library init, allocator, kernels' first launch) is not timed.
        runner.generate(warmup, min(4, args.output_len))
        log(f"{runner.name}: {len(prompts)} prompts x ({args.input_len} in, "
            f"{args.output_len} out)")
        steps: list[StepRecord] | None = None
        kwargs = {}
        if args.step_stats and runner.name == "vllm-volta":
            steps = kwargs["step_times"] = []
        sampler = clock_sampler(args, runner.device)
        with sampler, timed(runner.device) as t:
            output_lens = runner.generate(prompts, args.output_len, **kwargs)
        results[runner.name] = {"dtype": str(runner.dtype).removeprefix("torch."),
                                **throughput_metrics(t["elapsed"], prompts, output_lens)}
        if args.gpu_stats:
            results[runner.name]["gpu_stats"] = sampler.summary
            log(f"{runner.name}: GPU {gpu_clocks.describe(sampler.summary)}")
        log(f"{runner.name}: {results[runner.name]['output_tokens_per_second']:.1f} output tok/s")
        if steps is not None:
            results[runner.name]["step_stats"] = stats = step_stats(steps)
            log(", ".join(f"{v['count']} {k.replace('_', ' ')}: {v['seconds']:.3f} s"
                          for k, v in stats.items()))

    result = offline_result("throughput", args, results, input_len=args.input_len,
                            output_len=args.output_len, num_prompts=args.num_prompts)
    if "vllm-volta" in results and "hf" in results:
        result["hf_batch_size"] = args.hf_batch_size
        result["ratio_vs_hf"] = {k: ratio(results["vllm-volta"][k], results["hf"][k])
                                 for k in _RATIO_KEYS}
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
