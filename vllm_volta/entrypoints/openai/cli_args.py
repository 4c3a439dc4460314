"""Command-line flags of the OpenAI server (vLLM's names).

Engine flags (--dtype, --max-model-len, --max-num-seqs, --enable-prefix-caching, ...)
come from ``EngineArgs.add_cli_args`` so the server and the engine never disagree on
them; this module adds the HTTP-side flags.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from vllm_volta.entrypoints.openai.reasoning_parsers import REASONING_PARSERS
from vllm_volta.entrypoints.openai.tool_parsers import TOOL_PARSERS
from vllm_volta.logger import init_logger

logger = init_logger(__name__)

# vLLM flags that command lines written for vLLM carry, accepted so they run unchanged:
# flag -> (argparse kwargs, why it changes nothing here, the values this server honours or None
# for any). Other values are refused (check_vllm_flags), naming the flag.
_NO_EFFECT_FLAGS: dict[str, tuple[dict[str, Any], str, tuple[str, ...] | None]] = {
    "--disable-custom-all-reduce": ({"action": "store_true"},
                                    "tensor parallelism all-reduces through NCCL (no custom all-reduce)", None),
    "--swap-space": ({"type": float}, "preempted requests are recomputed, never swapped to CPU memory", None),
    "--disable-log-requests": ({"action": "store_true"}, "requests are not logged", None),
    "--task": ({"type": str}, "every model generates and embeds (/v1/embeddings)",
               ("auto", "generate", "embed", "embedding")),
    "--runner": ({"type": str}, "every model generates and embeds (/v1/embeddings)", ("auto", "generate", "pooling")),
    "--attention-backend": ({"type": str}, "the attention backend is chosen per GPU (VOLTA_PAGED on CUDA); "
                                           "VLLM_VOLTA_ATTENTION_BACKEND forces one", None),
    "--tokenizer-mode": ({"type": str}, "tokenizers load through transformers", ("auto", "hf")),
}


def _number(text: str, minimum: float, inclusive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < minimum or (value == minimum and not inclusive) or value != value:
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
    return value


def _positive_float(text: str) -> float:
    return _number(text, 0.0, inclusive=False)


def _non_negative_float(text: str) -> float:
    return _number(text, 0.0, inclusive=True)


def add_server_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every flag of the server (shared by `vllm-volta serve` and api_server)."""
    from vllm_volta.engine.arg_utils import EngineArgs

    group = parser.add_argument_group("server")
    group.add_argument("--host", type=str, default=None, help="Host to bind (default: all).")
    group.add_argument("--port", type=int, default=8000, help="Port to listen on.")
    group.add_argument("--api-key", type=str, default=None,
                       help="Require 'Authorization: Bearer <key>' on every route but /health "
                            "(and /metrics with --metrics-without-auth).")
    group.add_argument("--chat-template", type=str, default=None,
                       help="Chat template: a file path or the Jinja template inline.")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="Parse tool calls out of chat outputs when a request sends tools "
                            "(tool_choice \"auto\"); needs --tool-call-parser.")
    group.add_argument("--tool-call-parser", type=str, default=None, choices=sorted(TOOL_PARSERS),
                       help="How the model writes tool calls: hermes (<tool_call>{json}</tool_call>: "
                            "Qwen2.5, Qwen3, Hermes), llama3_json (Llama 3.1-3.3 JSON calls), pythonic "
                            "([f(a=1), g()]: Llama 3.2 / 4 pythonic templates), mistral ([TOOL_CALLS]), "
                            "qwen3_coder (<function=NAME><parameter=KEY>: Qwen3.5, Qwen3-Coder, Qwen3-Next) "
                            "or gemma4 (<|tool_call>call:NAME{...}<tool_call|>).")
    group.add_argument("--reasoning-parser", type=str, default=None, choices=sorted(REASONING_PARSERS),
                       help="Put the thinking part of chat outputs in reasoning_content: qwen3 "
                            "(a <think> block the output or the prompt opens: Qwen3, Qwen3.5), "
                            "deepseek_r1 (reasoning up to </think>) or gemma4 (<|channel>thought...<channel|>).")
    group.add_argument("--uvicorn-log-level", type=str, default="info",
                       choices=["debug", "info", "warning", "error", "critical", "trace"])
    group.add_argument("--disable-uvicorn-access-log", action="store_true",
                       help="Do not log every HTTP request (uvicorn's access log): one line per "
                            "request is event-loop time at hundreds of requests a second.")
    group.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                       help="Run the engine core in a process of its own, so that its host work "
                            "(scheduling, launches, outputs) does not share the interpreter "
                            "lock with the HTTP event loop. Default: on with a GPU, off on CPU "
                            "(where the forward pass, not the host, is the limit).")
    group.add_argument("--max-request-body-mb", type=_positive_float, default=32.0,
                       help="Refuse request bodies over this many MB with 413, before reading "
                            "them whole (default 32).")
    group.add_argument("--metrics-without-auth", action="store_true",
                       help="With --api-key, serve /metrics without the key (for a scraper); "
                            "/health never needs it.")
    group.add_argument("--restart-engine-on-failure", action="store_true",
                       help="When the engine dies (engine core process gone, CUDA error, lost "
                            "tensor-parallel worker), start a new one and keep serving; the "
                            "requests in flight fail. Default: the server exits with status 1, "
                            "for a supervisor to restart it.")
    group.add_argument("--shutdown-timeout", type=_non_negative_float, default=5.0,
                       help="On SIGTERM, seconds running requests get to finish before they are "
                            "ended with an error (streams: an error event, then [DONE]).")
    EngineArgs.add_cli_args(parser.add_argument_group("engine"))
    compat = parser.add_argument_group("vLLM flags with no effect here (accepted so vLLM commands run)")
    for flag, (kwargs, why, _) in _NO_EFFECT_FLAGS.items():
        compat.add_argument(flag, default=None, help=why, **kwargs)
    return parser


def check_vllm_flags(args: argparse.Namespace) -> None:
    """Log the vLLM-only flags that were given (and why they change nothing); ValueError for a
    value this server cannot honour (e.g. --tokenizer-mode mistral), naming the flag."""
    for flag, (_, why, allowed) in _NO_EFFECT_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value in (None, False):
            continue
        if allowed is not None and str(value).lower() not in allowed:
            raise ValueError(f"{flag} {value!r} is not supported; supported: {', '.join(allowed)}")
        logger.info("%s: no effect here (%s)", flag if value is True else f"{flag} {value}", why)


def tool_call_parser(args: argparse.Namespace) -> str | None:
    """The parser the chat endpoint uses for tool calls, or None (--enable-auto-tool-choice
    without --tool-call-parser is an error, as in vLLM)."""
    if not getattr(args, "enable_auto_tool_choice", False):
        return None
    if not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser "
                         f"(one of: {', '.join(sorted(TOOL_PARSERS))})")
    return args.tool_call_parser


def build_engine_args(args: argparse.Namespace) -> Any:
    """EngineArgs from the parsed flags (server-only flags are left out)."""
    from vllm_volta.engine.arg_utils import EngineArgs

    return EngineArgs.from_cli_args(args)


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a path to a file, else the template itself."""
    if value is None:
        return None
    if "\n" not in value and os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:  # neither a file nor Jinja: most likely a mistyped path
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    return value
