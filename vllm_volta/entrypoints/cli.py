"""The ``vllm-volta`` command, with vLLM's subcommands and flag names.

``serve [MODEL]`` (the OpenAI-compatible server), ``chat`` / ``complete`` (talk to a running
server), ``bench latency|throughput|serve`` (the benchmarks of a source checkout) and
``collect-env`` (every platform decision on this machine, and why).
"""

from __future__ import annotations

import argparse

from vllm_volta.entrypoints.cli_bench import BENCHMARKS
from vllm_volta.entrypoints.cli_client import add_client_args
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
    add_client_args(sub.add_parser("chat", help="Chat with a running server",
                                   description="Chat with a running OpenAI-compatible server: "
                                               "one line per message from stdin, or --quick."),
                    chat=True)
    add_client_args(sub.add_parser("complete", help="Complete prompts on a running server",
                                   description="Complete text on a running OpenAI-compatible "
                                               "server: one prompt per stdin line, or --quick."),
                    chat=False)
    bench = sub.add_parser("bench", help="Run a benchmark (latency, throughput, serve)",
                           description="Run a benchmark of benchmarks/ (source checkout); "
                                       "`vllm-volta bench KIND --help` lists its flags.",
                           add_help=True)
    bench.add_argument("bench_kind", choices=list(BENCHMARKS), metavar="KIND",
                       help=f"one of {', '.join(BENCHMARKS)}")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, metavar="FLAGS",
                       help="the benchmark's flags (vLLM's names)")
    env = sub.add_parser("collect-env", help="Print the platform decisions for this machine",
                         description="Print every decision the platform layer takes on this "
                                     "machine (device, extension build, dtype, attention "
                                     "backends, kernels, tuned configs, CUDA graphs) and why.")
    env.add_argument("--json", action="store_true", help="print JSON instead of text")
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
    elif args.command in ("chat", "complete"):
        from vllm_volta.entrypoints import cli_client

        try:
            (cli_client.run_chat if args.command == "chat" else cli_client.run_complete)(args)
        except KeyboardInterrupt:
            pass
        except ValueError as e:
            raise SystemExit(f"vllm-volta {args.command}: {e}") from None
    elif args.command == "bench":
        from vllm_volta.entrypoints.cli_bench import run_bench

        run_bench(args.bench_kind, args.bench_args)
    elif args.command == "collect-env":
        from vllm_volta.entrypoints.collect_env import main as collect_env

        collect_env(as_json=args.json)
