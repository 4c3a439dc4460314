"""The chunked-prefill policy's trade-off: decode ITL during a long prefill vs that prompt's TTFT.

    python benchmarks/benchmark_long_prefill_policy.py --config qwen2.5-7b --dtype half \\
        --max-model-len 33000 --prefill-len 32000 --max-num-batched-tokens 2048 \\
        --reference-lens 0 1024 --thresholds 0 256

Runs benchmarks/benchmark_long_prefill_itl.py's workload (all of its flags apply) once per
(--reference-lens x --thresholds) pair: `prefill_attention_reference_len` (0 = no attention cost
cap) and `long_prefill_token_threshold` (0 = no per-step token limit), a fresh engine each.
Prints JSON: one row per setting with the p50 / p99 ITL ratios (during / before the prefill),
whether the p99 target is met, the long prompt's time to first token and its number of steps.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks import benchmark_long_prefill_itl as itl  # noqa: E402
from benchmarks.cli_args import engine_kwargs  # noqa: E402
from benchmarks.utils import device_info, log, random_token_prompts, run_and_emit  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """(this script's sweep flags, the ITL benchmark's flags)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--reference-lens", type=int, nargs="+", default=[0, 1024],
                        help="prefill_attention_reference_len values (0: no cost cap)")
    parser.add_argument("--thresholds", type=int, nargs="+", default=[0],
                        help="long_prefill_token_threshold values (0: none)")
    sweep, rest = parser.parse_known_args(argv)
    for name in ("reference_lens", "thresholds"):
        bad = [v for v in getattr(sweep, name) if v < 0]
        if bad:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {bad}")
    return sweep, itl.parse_args(rest)


def _one(args: argparse.Namespace, vocab_size: int, policy: dict[str, int]) -> dict[str, Any]:
    from vllm_volta.engine.arg_utils import EngineArgs
    from vllm_volta.engine.llm_engine import LLMEngine
    from vllm_volta.sampling_params import SamplingParams

    engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs(args), **policy))
    try:
        engine.add_request("warmup", random_token_prompts(1, 16, vocab_size, args.seed + 2)[0],
                           SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False))
        while engine.has_unfinished_requests():
            engine.step()
        result = itl.measure(engine, args, vocab_size)
    finally:
        engine.shutdown()
    keys = ("p50_ratio", "p99_ratio", "mean_ratio", "target_met", "prefill_time_to_first_token",
            "prefill_steps")
    return {**policy, **{k: result[k] for k in keys},
            "itl_p99_before": result["itl_before"]["p99"], "itl_p99_during": result["itl_during_prefill"]["p99"]}


def run(sweep: argparse.Namespace, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(args.model).vocab_size
    rows = []
    for ref in sweep.reference_lens:
        for threshold in sweep.thresholds:
            policy = {"prefill_attention_reference_len": ref, "long_prefill_token_threshold": threshold}
            log(f"policy {policy}")
            rows.append(_one(args, vocab_size, policy))
    return {"benchmark": "long_prefill_policy", "device_info": device_info(), "model": args.model,
            "prefill_len": args.prefill_len, "num_streams": args.num_streams,
            "engine_kwargs": {k: v for k, v in engine_kwargs(args).items() if k != "model"},
            "target_p99_ratio": itl.TARGET_P99_RATIO, "rows": rows}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    sweep, args = parse_args(argv)
    return run_and_emit(lambda: run(sweep, args), args.output_json)


if __name__ == "__main__":
    main()
