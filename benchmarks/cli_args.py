"""Command-line flags shared by the benchmarks, spelled as vLLM spells them.

``engine_kwargs`` turns the parsed flags into EngineArgs keyword arguments; the serving
benchmark turns the same dict into ``vllm-volta serve`` flags, so both stay in step.
"""
from __future__ import annotations

import argparse
from typing import Any

from benchmarks.utils import resolve_model, shipped_configs
from vllm_volta.config import CUDAGRAPH_MODES

# Engine flags: (flag, EngineArgs field, argparse kwargs). None defaults mean "engine default".
_ENGINE_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--dtype", "dtype", {"default": "auto",
                          "choices": ["auto", "half", "float16", "bfloat16", "float", "float32"]}),
    ("--max-num-seqs", "max_num_seqs", {"type": int, "default": None}),
    ("--max-num-batched-tokens", "max_num_batched_tokens", {"type": int, "default": None}),
    ("--max-model-len", "max_model_len", {"type": int, "default": None}),
    ("--gpu-memory-utilization", "gpu_memory_utilization", {"type": float, "default": None}),
    ("--enforce-eager", "enforce_eager", {"action": "store_true"}),
    ("--async-scheduling", "async_scheduling", {"action": "store_true"}),
    ("--cudagraph-mode", "cudagraph_mode", {"default": None, "choices": CUDAGRAPH_MODES}),
    ("--cudagraph-metrics", "cudagraph_metrics", {"action": "store_true"}),
    ("--cuda-graph-sizes", "cuda_graph_sizes", {"type": int, "nargs": "+", "default": None}),
    # Decode steps with a longer context run without the full decode graph (32k / 128k benchmarks).
    ("--max-seq-len-to-capture", "max_seq_len_to_capture", {"type": int, "default": None}),
    ("--tokenizer", "tokenizer", {"default": None}),
]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--model / --config, --load-format, --seed and the engine flags."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="HF model name or local directory")
    src.add_argument("--config", default=None,
                     help=f"shipped config ({', '.join(shipped_configs())}) or a path to a "
                          "config.json / its directory; implies --load-format dummy")
    parser.add_argument("--load-format", default=None,
                        choices=["auto", "safetensors", "gguf", "dummy"], help="dummy = random weights built on the device (default with --config)")
    parser.add_argument("--seed", type=int, default=0, help="seeds prompts and weights")
    for flag, _, kwargs in _ENGINE_FLAGS:
        parser.add_argument(flag, **kwargs)


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    """--backend, --compare-hf and --temperature for the offline benchmarks."""
    parser.add_argument("--backend", default="vllm-volta", choices=["vllm-volta", "hf"])
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature on both sides (0 = greedy); vLLM's "
                             "benchmarks sample at 1.0")
    parser.add_argument("--compare-hf", action="store_true",
                        help="also run transformers generate on the same workload; report ratios")


def finalize_model_args(args: argparse.Namespace) -> None:
    """Resolve --model/--config into args.model and pick the load format's default."""
    args.model = resolve_model(args.model, args.config)
    if args.load_format is None:
        args.load_format = "dummy" if args.config is not None else "auto"


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineArgs keyword arguments for the flags the user set (others keep engine defaults)."""
    kwargs: dict[str, Any] = {"model": args.model, "load_format": args.load_format,
                              "seed": args.seed}
    for _, field, spec in _ENGINE_FLAGS:
        value = getattr(args, field)
        if spec.get("action") == "store_true":
            if value:
                kwargs[field] = True
        elif value is not None:
            kwargs[field] = value
    if args.load_format == "dummy" and args.tokenizer is None:
        # Random-weight models ship no tokenizer; token-id prompts do not need one.
        kwargs["skip_tokenizer_init"] = True
    return kwargs


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Reject non-positive counts with a message naming the flag."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= 1, got {value}")
