"""Host (Python/CPU) overhead per engine step, with a per-phase breakdown.

Runs the real LLMEngine on a tiny model (``--config tiny-llama``, random weights, token-id
prompts, no tokenizer) so that the model forward is small and what is left is the engine's
own work: scheduling, input preparation, sampling and output processing. Each batch size
in ``--batch-sizes`` runs that many prompts of ``--input-len`` tokens to
``--output-len`` tokens; only pure-decode steps are timed. Phases are measured with
``time.perf_counter`` around the engine's own methods (wrapped on the instances, so the
engine carries no timing code):

    schedule   Scheduler.schedule
    prepare    ModelRunner._prepare_inputs (flat ids, positions, attention metadata)
    forward    ModelRunner._forward + compute_logits (the model; small with a tiny config)
    sample     ModelRunner._sample (SamplingMetadata, Sampler, device->host of the ids)
    output     the rest of LLMEngine.step (update_from_output, stop checks, RequestOutputs;
               with --core-outputs the engine core's deltas instead, and their pickling)

Prints one JSON document. ``--profile FILE`` also writes cProfile stats of the timed steps.
"""
from __future__ import annotations

import argparse
import cProfile
import random
import statistics
import sys
import time
from collections import defaultdict
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.phase_timer import PhaseTimer  # noqa: E402
from benchmarks.utils import log, resolve_model, run_and_emit  # noqa: E402

PHASES = ("schedule", "prepare", "forward", "sample", "output")


def build_engine(args: argparse.Namespace, max_num_seqs: int) -> Any:
    from vllm_volta.engine.arg_utils import EngineArgs
    from vllm_volta.engine.llm_engine import LLMEngine

    engine_args = EngineArgs(
        model=resolve_model(None, args.config), load_format="dummy", skip_tokenizer_init=True,
        dtype=args.dtype, seed=args.seed, max_num_seqs=max_num_seqs,
        max_model_len=args.input_len + args.output_len, disable_log_stats=True,
        max_num_batched_tokens=max(args.max_num_batched_tokens, args.input_len),
        cpu_kvcache_space=args.cpu_kvcache_space, enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling)
    return LLMEngine.from_engine_args(engine_args)


def instrument(engine: Any) -> PhaseTimer:
    timer = PhaseTimer()
    runner = engine.executor.worker.model_runner
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(runner, "_prepare_inputs", "prepare")
    timer.wrap(runner, "_forward", "forward")
    timer.wrap(runner.model, "compute_logits", "forward")
    timer.wrap(runner, "_sample", "sample")
    return timer


def run_batch(engine: Any, timer: PhaseTimer, batch_size: int, args: argparse.Namespace,
              profiler: cProfile.Profile | None) -> dict[str, Any]:
    """One batch to completion; returns mean per-decode-step times (ms) per phase."""
    from benchmarks.engine_runner import prefill_pending
    from vllm_volta.sampling_params import SamplingParams

    rng = random.Random(args.seed + batch_size)
    vocab = engine.model_config.get_vocab_size()
    params = SamplingParams(temperature=args.temperature, top_p=1.0, ignore_eos=True,
                            max_tokens=args.output_len, detokenize=False)
    for i in range(batch_size):
        prompt = [rng.randrange(vocab) for _ in range(args.input_len)]
        engine.add_request(f"b{batch_size}-{i}", prompt, params)
    step_times: list[float] = []
    phase_sums: dict[str, float] = defaultdict(float)
    num_outputs = 0
    while engine.has_unfinished_requests():
        timer.current.clear()
        decode = not prefill_pending(engine.scheduler)
        if decode and profiler is not None:
            profiler.enable()
        t0 = time.perf_counter()
        outputs = engine.step(finished_only=args.finished_only)
        if args.core_outputs:
            ForkingPickler.dumps(("step", outputs, engine.get_stats()))
        elapsed = time.perf_counter() - t0
        if decode and profiler is not None:
            profiler.disable()
        num_outputs += len(outputs)
        if not decode:
            continue
        step_times.append(elapsed)
        for phase in PHASES[:-1]:
            phase_sums[phase] += timer.current.get(phase, 0.0)
        phase_sums["output"] += elapsed - sum(timer.current.values())
    n = max(len(step_times), 1)
    return {
        "batch_size": batch_size,
        "decode_steps": len(step_times),
        "step_ms_mean": 1e3 * statistics.fmean(step_times) if step_times else None,
        "step_ms_median": 1e3 * statistics.median(step_times) if step_times else None,
        "host_ms_mean": 1e3 * (sum(step_times) - phase_sums["forward"]) / n,
        "phases_ms_mean": {p: 1e3 * phase_sums[p] / n for p in PHASES},
        "num_outputs": num_outputs,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny-llama")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--cpu-kvcache-space", type=float, default=1.0)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="schedule step n+1 while step n runs (the GPU benchmarks' setting)")
    parser.add_argument("--no-finished-only", dest="finished_only", action="store_false",
                        help="build a RequestOutput for every advanced request every step "
                             "(streaming); default: finished ones only (LLM.generate)")
    parser.add_argument("--core-outputs", action="store_true",
                        help="report what the server's engine core process sends: per step, "
                             "each advanced request's delta (core_outputs.py), pickled")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: tiny ops, no thread wake-up noise)")
    parser.add_argument("--profile", default=None, help="write cProfile stats here")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    for name in ("input_len", "output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.core_outputs and args.finished_only:
        args.finished_only = False  # the core reports every advanced request
    if min(args.batch_sizes) < 1:
        raise ValueError("--batch-sizes must all be >= 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    torch.set_num_threads(args.threads)
    engine = build_engine(args, max(args.batch_sizes))
    if args.core_outputs:
        from vllm_volta.engine.core_outputs import OutputEncoder
        engine.output_builder = OutputEncoder().encode
    timer = instrument(engine)
    profiler = cProfile.Profile() if args.profile else None
    results = []
    for batch_size in args.batch_sizes:
        log(f"batch {batch_size}: {args.input_len} in / {args.output_len} out")
        results.append(run_batch(engine, timer, batch_size, args, profiler))
    engine.shutdown()
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return {"benchmark": "host_overhead", "config": args.config,
            "device": engine.vllm_config.device_config.device,
            "input_len": args.input_len, "output_len": args.output_len,
            "finished_only": args.finished_only, "core_outputs": args.core_outputs,
            "results": results}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
