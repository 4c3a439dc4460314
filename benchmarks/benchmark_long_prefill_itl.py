"""Inter-token latency of running decode streams while a long prompt is chunk-prefilled beside them.

    python benchmarks/benchmark_long_prefill_itl.py --config qwen2.5-7b --dtype half \\
        --max-model-len 33000 --prefill-len 32000 --num-streams 1 --max-num-batched-tokens 2048

--num-streams decode streams (prompts of --stream-input-len random tokens) run alone for
--baseline-tokens tokens; then one prompt of --prefill-len tokens is submitted and prefilled in
chunks (the engine's chunked prefill: each step holds the decodes plus up to
--max-num-batched-tokens prompt tokens) until it yields its first token. A stream's inter-token
latency is the wall time between two engine steps that each gave it a token (with async
scheduling a step returns the previous step's tokens, so the spacing is the same). Prints JSON:
p50 / p99 / mean inter-token latency before and during the prefill, their ratios (target: p99
during <= 2x p99 before), the prefill's time to first token and its number of steps.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.cli_args import add_model_args, check_positive, engine_kwargs, finalize_model_args  # noqa: E402
from benchmarks.utils import device_info, log, random_token_prompts, run_and_emit, summarize  # noqa: E402

TARGET_P99_RATIO = 2.0
_PERCENTILES = (50, 90, 99)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--num-streams", type=int, default=1, help="decode streams running beside the prefill")
    parser.add_argument("--stream-input-len", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=32000, help="the long prompt's length in tokens")
    parser.add_argument("--baseline-tokens", type=int, default=64,
                        help="tokens per stream timed before the long prompt arrives")
    parser.add_argument("--warmup-tokens", type=int, default=4, help="stream tokens not timed at the start")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--output-json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    check_positive(args, "num_streams", "stream_input_len", "prefill_len", "baseline_tokens")
    if args.warmup_tokens < 0:
        raise ValueError(f"--warmup-tokens must be >= 0, got {args.warmup_tokens}")
    finalize_model_args(args)
    return args


class _Streams:
    """Arrival times of each decode stream's tokens, from the engine's per-step outputs."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = set(ids)
        self.counts = dict.fromkeys(ids, 0)
        self.arrivals: dict[str, list[float]] = {rid: [] for rid in ids}

    def observe(self, outputs: Sequence[Any], now: float) -> None:
        for out in outputs:
            if out.request_id in self.ids:
                n = len(out.outputs[0].token_ids)
                if n > self.counts[out.request_id]:
                    self.counts[out.request_id] = n
                    self.arrivals[out.request_id].append(now)

    def min_count(self) -> int:
        return min(self.counts.values())

    def gaps(self, start: float, end: float) -> list[float]:
        """Inter-token gaps whose later token arrived in (start, end]."""
        return [b - a for times in self.arrivals.values() for a, b in zip(times, times[1:]) if start < b <= end]


def _stats(gaps: list[float]) -> dict[str, float] | None:
    if not gaps:
        return None
    out = summarize(gaps, _PERCENTILES)
    return {"count": len(gaps), **{k: out[k] for k in ("mean", "median", "p50", "p90", "p99")}}


def measure(engine: Any, args: argparse.Namespace, vocab_size: int) -> dict[str, Any]:
    """Run the workload on a built engine; returns the ITL summary."""
    from vllm_volta.sampling_params import SamplingParams

    max_len = engine.model_config.max_model_len
    if args.prefill_len + 1 > max_len:
        raise ValueError(f"--prefill-len ({args.prefill_len}) + 1 output token must fit max_model_len ({max_len}); "
                         "raise --max-model-len")
    budget = engine.vllm_config.scheduler_config.max_num_batched_tokens
    # Enough tokens for the baseline and one per step of the prefill (at least one prompt token a
    # step), within the context; the streams are aborted at the end.
    stream_tokens = min(max_len - args.stream_input_len,
                        args.warmup_tokens + args.baseline_tokens + args.prefill_len + 8)
    if stream_tokens <= args.warmup_tokens + args.baseline_tokens:
        raise ValueError("--stream-input-len leaves no room for --baseline-tokens within max_model_len")
    stream_params = SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=stream_tokens,
                                   detokenize=False)
    prompts = random_token_prompts(args.num_streams, args.stream_input_len, vocab_size, args.seed)
    ids = [f"stream-{i}" for i in range(args.num_streams)]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, stream_params)
    streams = _Streams(ids)

    def step() -> list[Any]:
        outputs = engine.step()
        streams.observe(outputs, time.perf_counter())
        return outputs

    need = args.warmup_tokens + args.baseline_tokens + 1
    while streams.min_count() < need:
        step()
    baseline_start = max(times[args.warmup_tokens] for times in streams.arrivals.values())
    baseline_end = time.perf_counter()

    long_prompt = random_token_prompts(1, args.prefill_len, vocab_size, args.seed + 1)[0]
    engine.add_request("long-prefill", long_prompt, SamplingParams(temperature=args.temperature, ignore_eos=True,
                                                                   max_tokens=1, detokenize=False))
    submitted = time.perf_counter()
    steps, first_token = 0, None
    for steps in itertools.count(1):
        outputs = step()
        if any(o.request_id == "long-prefill" and o.outputs[0].token_ids for o in outputs):
            first_token = time.perf_counter()
            break
        if streams.min_count() >= stream_tokens:
            raise RuntimeError("the decode streams finished before the long prompt's first token; "
                               "lower --prefill-len or raise --max-model-len")
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()

    before = _stats(streams.gaps(baseline_start, baseline_end))
    during = _stats(streams.gaps(submitted, first_token))
    ratios = {key: during[key] / before[key] if before and during and before[key] > 0 else None
              for key in ("p50", "p99", "mean")}
    log(f"ITL before {before['p50'] * 1e3:.2f} / {before['p99'] * 1e3:.2f} ms (p50 / p99), during the "
        f"{args.prefill_len}-token prefill {during['p50'] * 1e3:.2f} / {during['p99'] * 1e3:.2f} ms: "
        f"p99 ratio {ratios['p99']:.2f} over {steps} steps of <= {budget} tokens")
    return {"itl_before": before, "itl_during_prefill": during,
            "p50_ratio": ratios["p50"], "p99_ratio": ratios["p99"], "mean_ratio": ratios["mean"],
            "target_p99_ratio": TARGET_P99_RATIO,
            "target_met": ratios["p99"] is not None and ratios["p99"] <= TARGET_P99_RATIO,
            "prefill_time_to_first_token": first_token - submitted, "prefill_steps": steps,
            "max_num_batched_tokens": budget}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoConfig

    from vllm_volta.engine.arg_utils import EngineArgs
    from vllm_volta.engine.llm_engine import LLMEngine

    hf_config = AutoConfig.from_pretrained(args.model)
    kwargs = engine_kwargs(args)
    log(f"building vllm-volta engine: {kwargs}")
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    try:
        # One short request first, so the timed steps do not include first-use work.
        from vllm_volta.sampling_params import SamplingParams

        engine.add_request("warmup", random_token_prompts(1, 16, hf_config.vocab_size, args.seed + 2)[0],
                           SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False))
        while engine.has_unfinished_requests():
            engine.step()
        result = measure(engine, args, hf_config.vocab_size)
    finally:
        engine.shutdown()
    return {"benchmark": "long_prefill_itl", "device_info": device_info(), "model": args.model,
            "dtype": str(engine.model_config.dtype).removeprefix("torch."), "num_streams": args.num_streams,
            "stream_input_len": args.stream_input_len, "prefill_len": args.prefill_len,
            "baseline_tokens": args.baseline_tokens, "engine_kwargs": {k: v for k, v in kwargs.items() if k != "model"},
            **result}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
