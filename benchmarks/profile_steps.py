"""Where a step's GPU time goes: torch.profiler over engine steps, kernels grouped by name.

    python benchmarks/profile_steps.py --config llama-3-8b --dtype half --batch-size 1 \\
        --input-len 128 --output-len 64 --profile-steps 20

Runs ``--batch-size`` prompts of ``--input-len`` tokens, lets the prefill and
``--warmup-steps`` decode steps pass, then profiles ``--profile-steps`` engine steps (CUDA
graph replays included: their kernels are traced one by one). ``--phase prefill`` profiles
the steps that run the prompts instead (after one unprofiled batch of the same prompts, which
warms up the kernels). Prints JSON: wall time per step, GPU kernel time per step (the sum of
kernel durations; the rest of the wall time is GPU idle: host work, launch gaps), and the
kernels with the most time per step.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.cli_args import add_model_args, check_positive, engine_kwargs, finalize_model_args  # noqa: E402
from benchmarks.utils import log, random_token_prompts, run_and_emit, synchronize  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                        help="profile decode steps, or the steps that run the prompts")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature (0: greedy; the throughput benchmark uses 1)")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--chrome-trace", default=None, metavar="PATH",
                        help="also write the profiled steps as a Chrome trace (kernel order, gaps)")
    args = parser.parse_args(argv)
    check_positive(args, "batch_size", "input_len", "output_len", "profile_steps", "top")
    if args.phase == "decode" and args.output_len <= args.warmup_steps + args.profile_steps:
        raise ValueError("--output-len must exceed --warmup-steps + --profile-steps "
                         "(only decode steps are profiled)")
    finalize_model_args(args)
    return args


def kernel_table(events: Any, num_steps: int, top: int) -> tuple[float, list[dict[str, Any]]]:
    """(GPU kernel microseconds per step, the `top` kernels by time) from profiler events."""
    from torch.autograd import DeviceType

    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev.device_type != DeviceType.CUDA:
            continue
        total[ev.name] += ev.device_time_total
        count[ev.name] += 1
    busy = sum(total.values()) / num_steps
    rows = sorted(total, key=total.get, reverse=True)[:top]
    return busy, [{"kernel": name[:120], "us_per_step": round(total[name] / num_steps, 2),
                   "calls_per_step": round(count[name] / num_steps, 2),
                   "us_per_call": round(total[name] / count[name], 2)} for name in rows]


BATCHES = ("warmup", "profiled", "plain")


def add_prompts(runner: Any, args: argparse.Namespace, tag: str) -> None:
    """A batch of fresh prompts (another seed per batch: no prefix-cache hits between them)."""
    engine = runner.engine
    vocab = engine.model_config.hf_config.vocab_size
    params = runner.sampling_params(args.output_len)
    seed = args.seed + BATCHES.index(tag)
    for i, prompt in enumerate(random_token_prompts(args.batch_size, args.input_len, vocab, seed)):
        engine.add_request(f"{tag}-{i}", list(prompt), params)


def run_prefill(engine: Any) -> int:
    """Step until every prompt token has run (a prompt split over steps is done only after its
    last chunk, so the queue of waiting requests is not enough); returns the number of steps."""
    from benchmarks.engine_runner import prefill_pending

    steps = 0
    while prefill_pending(engine.scheduler) or steps < 1:
        engine.step(finished_only=True)
        steps += 1
    synchronize()
    return steps


def timed_steps(runner: Any, args: argparse.Namespace, tag: str) -> tuple[float, int]:
    """(wall seconds, steps) of the profiled kind of steps, starting from the current state."""
    engine = runner.engine
    if args.phase == "prefill":
        engine.abort_all_requests()
        add_prompts(runner, args, tag)
        start = time.perf_counter()
        steps = run_prefill(engine)
        return time.perf_counter() - start, steps
    start = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests() and steps < args.profile_steps:
        engine.step(finished_only=True)
        steps += 1
    synchronize()
    return time.perf_counter() - start, steps


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.engine_runner import EngineRunner

    runner = EngineRunner(engine_kwargs(args), temperature=args.temperature)
    engine = runner.engine
    add_prompts(runner, args, "warmup")
    run_prefill(engine)
    if args.phase == "decode":
        for _ in range(args.warmup_steps + 1):
            engine.step(finished_only=True)
        synchronize()
    decode_rows = len(engine.scheduler.running) if args.phase == "decode" else None
    if decode_rows is not None and decode_rows < args.batch_size:
        # The first prompts' requests ran out of tokens while the last ones were prefilling.
        log(f"warning: only {decode_rows} of {args.batch_size} requests are still decoding; "
            f"raise --output-len to profile the whole batch")
    log(f"profiling {args.phase} steps at batch {args.batch_size}")
    with profile(activities=[ProfilerActivity.CPU]
                 + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])) as prof:
        wall, steps = timed_steps(runner, args, "profiled")
    if args.chrome_trace:
        prof.export_chrome_trace(args.chrome_trace)
    # Unprofiled timing of the same kind of steps (the profiler adds host overhead).
    wall_plain, plain_steps = timed_steps(runner, args, "plain")
    busy_us, kernels = kernel_table(prof.events(), steps, args.top)
    graphs = engine.executor.worker.model_runner.graph_runner
    runner.close()
    wall_ms = 1e3 * wall_plain / max(plain_steps, 1)
    return {"benchmark": "profile_steps", "model": args.model, "phase": args.phase,
            "batch_size": args.batch_size, "temperature": args.temperature,
            "decode_rows": decode_rows, "cuda_graphs": graphs is not None,
            "profiled_steps": steps,
            "wall_ms_per_step_profiled": round(1e3 * wall / steps, 3),
            "wall_ms_per_step": round(wall_ms, 3),
            "gpu_kernel_ms_per_step": round(busy_us / 1e3, 3),
            "gpu_busy_fraction": round(busy_us / 1e3 / wall_ms, 3),
            "top_kernels": kernels}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
