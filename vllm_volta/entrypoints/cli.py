"""The ``vllm-volta`` command: ``vllm-volta serve [MODEL] [flags]`` (vLLM's flag names)."""

from __future__ import annotations

import argparse

from vllm_volta.entrypoints.openai.cli_args import add_server_args


def make_parser() -> argparse.ArgumentParser:
    """The top-level parser with its subcommands."""
    from vllm_volta import __version__

    parser = argparse.ArgumentParser(prog="vllm-volta",
                                     description="vLLM's API, fast on V100/T4 and newer GPUs")
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="Start the OpenAI-compatible server",
                           description="Start the OpenAI-compatible server. Without MODEL "
                                       "the default model (SmolLM2-135M-Instruct) is served.")
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                       help="Model name or path (HF folder or .gguf file)")
    add_server_args(serve)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        parser.exit(2)
    if args.command == "serve" and args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            parser.error(f"MODEL ({args.model_tag}) and --model ({args.model}) disagree")
        args.model = args.model_tag
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``vllm-volta`` console script."""
    args = parse_args(argv)
    if args.command == "serve":
        from vllm_volta.entrypoints.openai.api_server import run_server

        run_server(args)
