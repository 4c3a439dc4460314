"""Command-line flags of the OpenAI server (vLLM's names) and their mapping to EngineArgs."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

# Engine flags: argparse dest == EngineArgs field name. Their defaults are None so that
# only flags the user gave are passed on and EngineArgs keeps its own defaults.
_ENGINE_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--tokenizer", {"type": str, "help": "Tokenizer name or path (default: the model's)."}),
    ("--dtype", {"type": str, "choices": ["auto", "half", "float16", "bfloat16", "float",
                                          "float32"],
                 "help": "Weight/activation dtype (auto picks per device)."}),
    ("--max-model-len", {"type": int, "help": "Maximum context length (prompt + output)."}),
    ("--gpu-memory-utilization", {"type": float,
                                  "help": "Fraction of GPU memory for weights + KV cache."}),
    ("--max-num-seqs", {"type": int, "help": "Maximum sequences per batch."}),
    ("--max-num-batched-tokens", {"type": int, "help": "Token budget per engine step."}),
    ("--seed", {"type": int, "help": "Random seed."}),
    ("--tensor-parallel-size", {"type": int, "help": "Number of GPUs for tensor parallelism."}),
    ("--load-format", {"type": str, "choices": ["auto", "safetensors", "gguf", "dummy"],
                       "help": "Weight format (dummy = random weights)."}),
    ("--block-size", {"type": int, "help": "KV-cache block size in tokens."}),
    ("--num-gpu-blocks-override", {"type": int,
                                   "help": "Use exactly this many KV-cache blocks."}),
    ("--max-logprobs", {"type": int, "help": "Largest logprobs/top_logprobs a request may ask "
                                             "for (default 20)."}),
)


def add_server_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every flag of the server (shared by `vllm-volta serve` and api_server)."""
    parser.add_argument("--model", type=str, default=None,
                        help="Model name or path (HF folder or .gguf). Default: the built-in "
                             "default model.")
    parser.add_argument("--host", type=str, default=None, help="Host to bind (default: all).")
    parser.add_argument("--port", type=int, default=8000, help="Port to listen on.")
    parser.add_argument("--api-key", type=str, default=os.environ.get("VLLM_API_KEY"),
                        help="Require this key as 'Authorization: Bearer <key>' on /v1/*.")
    parser.add_argument("--served-model-name", type=str, nargs="+", default=None,
                        help="Model name(s) the API answers to (default: --model).")
    parser.add_argument("--chat-template", type=str, default=None,
                        help="Chat template: a file path or the template inline.")
    parser.add_argument("--uvicorn-log-level", type=str, default="info",
                        choices=["debug", "info", "warning", "error", "critical", "trace"])
    parser.add_argument("--trust-remote-code", action="store_true", default=None)
    parser.add_argument("--enforce-eager", action="store_true", default=None,
                        help="Disable CUDA graphs.")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=None, help="Reuse KV blocks of shared prompt prefixes.")
    for flag, kwargs in _ENGINE_FLAGS:
        parser.add_argument(flag, default=None, **kwargs)
    return parser


_ENGINE_DESTS = ("model", "trust_remote_code", "enforce_eager", "enable_prefix_caching") + \
    tuple(flag[2:].replace("-", "_") for flag, _ in _ENGINE_FLAGS if flag != "--max-logprobs")


def engine_kwargs(args: argparse.Namespace, field_names: set[str]) -> dict[str, Any]:
    """EngineArgs keyword arguments for the flags the user gave.

    A flag the engine has no field for is an error only when the user set it.
    """
    kwargs = {}
    for dest in _ENGINE_DESTS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest not in field_names:
            raise ValueError(f"--{dest.replace('_', '-')} is not supported by this engine")
        kwargs[dest] = value
    if args.max_logprobs is not None and "max_logprobs" in field_names:
        kwargs["max_logprobs"] = args.max_logprobs
    return kwargs


def build_engine_args(args: argparse.Namespace) -> Any:
    """EngineArgs for the parsed flags."""
    from vllm_volta.engine.arg_utils import EngineArgs

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    return EngineArgs(**engine_kwargs(args, names))


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a path to a file, else the template itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:  # neither a file nor Jinja: most likely a mistyped path
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    return value
