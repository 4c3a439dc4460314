"""``vllm-volta chat`` and ``vllm-volta complete``: talk to a running OpenAI-compatible server.

As vLLM's: ``--url`` (default http://localhost:8000/v1), ``--model-name`` (default: the first
model the server lists), ``--api-key`` (default $OPENAI_API_KEY, else "EMPTY"),
``--system-prompt`` (chat), ``--max-tokens``, and ``-q/--quick TEXT`` for one request whose
answer is printed; without it, an interactive loop reads one message per line from stdin
(``> `` prompt) until end of input. Chat keeps the conversation; answers are streamed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Iterator, TextIO

DEFAULT_URL = "http://localhost:8000/v1"


def add_client_args(parser: argparse.ArgumentParser, *, chat: bool) -> None:
    """The flags vLLM's ``chat`` / ``complete`` take."""
    parser.add_argument("--url", default=DEFAULT_URL,
                        help=f"the server's OpenAI API base URL (default {DEFAULT_URL})")
    parser.add_argument("--model-name", default=None,
                        help="model to ask (default: the first model the server lists)")
    parser.add_argument("--api-key", default=None,
                        help="API key (default: $OPENAI_API_KEY, else none is needed)")
    if chat:
        parser.add_argument("--system-prompt", default=None,
                            help="a system message that opens the conversation")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="most tokens per answer (default: the server's)")
    parser.add_argument("-q", "--quick", default=None, metavar="TEXT",
                        help="send TEXT once, print the answer and exit")


def check_client_args(args: argparse.Namespace) -> None:
    """Reject values the server would only refuse later, naming the flag."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be a positive integer, got {args.max_tokens}")
    if not args.url.startswith(("http://", "https://")):
        raise ValueError(f"--url must be an http:// or https:// URL, got {args.url!r}")


def _openai() -> Any:
    try:
        import openai
    except ImportError as e:  # a dependency, but a trimmed environment may lack it
        raise SystemExit("vllm-volta chat/complete need the openai package: pip install openai") from e
    return openai


def make_client(args: argparse.Namespace) -> tuple[Any, str]:
    """An OpenAI client for --url and the model to ask."""
    openai = _openai()
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.OpenAI(base_url=args.url, api_key=api_key)
    model = args.model_name
    if model is None:
        models = client.models.list().data
        if not models:
            raise SystemExit(f"the server at {args.url} lists no models; pass --model-name")
        model = models[0].id
    return client, model


def _extra(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.max_tokens is None else {"max_tokens": args.max_tokens}


def chat_once(client: Any, model: str, messages: list[dict[str, str]], args: argparse.Namespace,
              out: TextIO) -> str:
    """Stream one assistant answer to ``out``; returns its text."""
    stream = client.chat.completions.create(model=model, messages=messages, stream=True,
                                            **_extra(args))
    parts: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            text = choice.delta.content or ""
            parts.append(text)
            out.write(text)
            out.flush()
    out.write("\n")
    return "".join(parts)


def complete_once(client: Any, model: str, prompt: str, args: argparse.Namespace, out: TextIO) -> str:
    """Stream one completion of ``prompt`` to ``out``; returns its text."""
    stream = client.completions.create(model=model, prompt=prompt, stream=True, **_extra(args))
    parts: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.text or "")
            out.write(choice.text or "")
            out.flush()
    out.write("\n")
    return "".join(parts)


def _lines(inp: TextIO, out: TextIO, interactive: bool):
    """Input lines; the ``> `` prompt only where a person types."""
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        line = inp.readline()
        if not line:
            return
        yield line.rstrip("\n")


@contextlib.contextmanager
def _server_errors(args: argparse.Namespace) -> Iterator[None]:
    """An unreachable server, a refused key or a refused request as one line, not a traceback."""
    openai = _openai()
    try:
        yield
    except openai.APIConnectionError as e:
        raise SystemExit(f"cannot reach the server at --url {args.url}: {e}") from None
    except openai.AuthenticationError as e:
        raise SystemExit(f"the server at {args.url} refused the API key (--api-key or "
                         f"$OPENAI_API_KEY): {e.message}") from None
    except openai.APIStatusError as e:
        raise SystemExit(f"the server at {args.url} answered {e.status_code}: {e.message}") from None


def run_chat(args: argparse.Namespace, inp: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
    """``vllm-volta chat``: one-shot with --quick, else a conversation over stdin lines."""
    check_client_args(args)
    with _server_errors(args):
        _chat(args, inp, out)


def _chat(args: argparse.Namespace, inp: TextIO, out: TextIO) -> None:
    client, model = make_client(args)
    messages: list[dict[str, str]] = []
    if args.system_prompt:
        messages.append({"role": "system", "content": args.system_prompt})
    if args.quick is not None:
        messages.append({"role": "user", "content": args.quick})
        chat_once(client, model, messages, args, out)
        return
    print(f"Using model: {model} (end with Ctrl-D)", file=sys.stderr)
    for line in _lines(inp, out, inp.isatty()):
        messages.append({"role": "user", "content": line})
        messages.append({"role": "assistant", "content": chat_once(client, model, messages, args, out)})


def run_complete(args: argparse.Namespace, inp: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
    """``vllm-volta complete``: one-shot with --quick, else one completion per stdin line."""
    check_client_args(args)
    with _server_errors(args):
        _complete(args, inp, out)


def _complete(args: argparse.Namespace, inp: TextIO, out: TextIO) -> None:
    client, model = make_client(args)
    if args.quick is not None:
        complete_once(client, model, args.quick, args, out)
        return
    print(f"Using model: {model} (end with Ctrl-D)", file=sys.stderr)
    for line in _lines(inp, out, inp.isatty()):
        complete_once(client, model, line, args, out)
