"""Online serving: random token-id prompts streamed through our OpenAI completions endpoint.

    python benchmarks/benchmark_serving.py --config qwen2.5-1.5b --num-prompts 500 \\
        --input-len 512 --output-len 256 --request-rate 16 --ignore-eos

Without --base-url it starts ``vllm-volta serve`` itself (engine flags as for the offline
benchmarks) and stops it at the end; with --base-url it uses a running server. Requests arrive
as a Poisson process at --request-rate (inf = all at once), optionally capped at
--max-concurrency in flight. Prints one JSON document with vLLM's serving fields (TTFT, TPOT,
ITL, E2E latency: mean, median, std, pN; request and token throughput).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import httpx  # noqa: E402

from benchmarks.cli_args import (add_model_args, check_positive, engine_kwargs,  # noqa: E402
                                 finalize_model_args)
from benchmarks.process_cpu import ServerCpu  # noqa: E402
from benchmarks.serving_client import (RequestResult, run_in_processes, run_shard,  # noqa: E402
                                       send_completion, serving_metrics, split_shards)
from benchmarks.server_launcher import launched_server, server_flags  # noqa: E402
from benchmarks.utils import (device_info, log, random_lengths, random_token_prompts,  # noqa: E402
                              run_and_emit)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--base-url", default=None,
                        help="a running server (http://host:port); default: start one")
    parser.add_argument("--endpoint", default="/v1/completions")
    parser.add_argument("--served-model-name", default=None,
                        help="model name in requests (default: the server's first model)")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--input-len", "--random-input-len", dest="input_len", type=int,
                        default=1024)
    parser.add_argument("--output-len", "--random-output-len", dest="output_len", type=int,
                        default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.0,
                        help="vary each request's input and output length uniformly within "
                             "this fraction of --input-len / --output-len (vLLM's; 0: all equal, "
                             "so closed-loop requests finish and are replaced in waves)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="prompt token ids are drawn below this (default: the config's)")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals; inf = all at once")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of the arrival intervals (1 = Poisson)")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--client-processes", type=int, default=None,
                        help="processes sending the requests (default: one per 64 requests "
                             "in flight, at most half the CPUs)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="generate exactly --output-len tokens per request")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--metric-percentiles", default="50,90,99")
    parser.add_argument("--server-timeout", type=float, default=1200.0,
                        help="seconds to wait for a started server to become healthy")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for the started server (repeatable), e.g. "
                             "--server-arg=--enable-prefix-caching")
    parser.add_argument("--server-log", default=None,
                        help="write the started server's log here and keep it (default: a "
                             "temporary file, removed after a clean run)")
    parser.add_argument("--output-json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    check_positive(args, "num_prompts", "input_len", "output_len", "max_concurrency",
                   "vocab_size", "client_processes")
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate must be > 0 (or inf), got {args.request_rate}")
    if not args.burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {args.burstiness}")
    if not 0 <= args.random_range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    args.metric_percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    if args.base_url is None or args.model or args.config:
        finalize_model_args(args)
    elif args.vocab_size is None:
        raise ValueError("--vocab-size is required with --base-url when neither --model nor "
                         "--config names the model")
    return args


def _vocab_size(args: argparse.Namespace) -> int:
    if args.vocab_size is not None:
        return args.vocab_size
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(args.model).vocab_size


def _served_model(base_url: str, name: str | None) -> str:
    if name:
        return name
    models = httpx.get(f"{base_url}/v1/models", timeout=30.0).raise_for_status().json()
    return models["data"][0]["id"]


def client_processes(args: argparse.Namespace) -> int:
    """--client-processes, else one process per 64 requests that can be in flight at once (one
    Python thread parses ~10-20k stream chunks a second), at most half the CPUs."""
    if args.client_processes is not None:
        return args.client_processes
    in_flight = min(args.max_concurrency or args.num_prompts, args.num_prompts)
    return max(1, min(-(-in_flight // 64), (os.cpu_count() or 2) // 2))


async def _probe(url: str, payload: dict[str, Any]) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
        probe = await send_completion(client, url, payload)
    if not probe.success:
        raise RuntimeError(f"initial test request to {url} failed: {probe.error}")


def _run_requests(url: str, payloads: list[dict[str, Any]], probe_payload: dict[str, Any],
                  args: argparse.Namespace, processes: int) -> tuple[list[RequestResult], float]:
    shards = split_shards(url, payloads, processes, args.request_rate, args.burstiness,
                          args.seed, args.max_concurrency)
    # One request first: checks the endpoint and warms the server; not measured.
    asyncio.run(_probe(url, probe_payload))
    if processes == 1:
        results, start, end = asyncio.run(run_shard(shards[0]))
        return results, end - start
    return run_in_processes(shards)


def benchmark(base_url: str, args: argparse.Namespace, server_pid: int | None = None
              ) -> dict[str, Any]:
    model_name = _served_model(base_url, args.served_model_name)
    vocab_size = _vocab_size(args)
    input_lens = random_lengths(args.num_prompts, args.input_len, args.random_range_ratio,
                                args.seed + 2)
    output_lens = random_lengths(args.num_prompts, args.output_len, args.random_range_ratio,
                                 args.seed + 3)
    prompts = random_token_prompts(args.num_prompts, args.input_len, vocab_size, args.seed,
                                   lengths=input_lens if args.random_range_ratio else None)
    # return_token_ids (vLLM's extra): each chunk says how many tokens it carries, also when
    # the server sends several in one chunk or runs without a tokenizer (no text).
    payloads = [{"model": model_name, "prompt": p, "max_tokens": n_out,
                 "temperature": args.temperature, "stream": True, "return_token_ids": True,
                 "stream_options": {"include_usage": True}}
                for p, n_out in zip(prompts, output_lens)]
    if args.ignore_eos:  # vLLM's extension of the completions request
        for payload in payloads:
            payload["ignore_eos"] = True
    processes = client_processes(args)
    log(f"{args.num_prompts} requests at rate {args.request_rate}, max concurrency "
        f"{args.max_concurrency}, to {base_url}{args.endpoint}, from {processes} client "
        f"process{'es' if processes > 1 else ''}")
    # The probe's prompt is none of the timed ones: the server's prefix cache would keep it.
    probe = {**payloads[0], "max_tokens": 4,
             "prompt": random_token_prompts(1, args.input_len, vocab_size, args.seed + 1)[0]}
    # The server's CPU time (front end and engine core apart) when this process started it.
    cpu = ServerCpu(server_pid) if server_pid is not None else None
    results, duration = _run_requests(base_url + args.endpoint, payloads, probe, args, processes)
    metrics = serving_metrics(results, duration, args.metric_percentiles)
    if cpu is not None:
        metrics["server_cpu"] = cpu.delta(metrics["total_output_tokens"])
    if metrics["completed"] == 0:
        raise RuntimeError(f"every request failed; first error: {results[0].error}")
    errors = sorted({r.error for r in results if not r.success})
    log(f"completed {metrics['completed']}/{len(results)} in {duration:.2f} s, "
        f"{metrics['output_throughput']:.1f} output tok/s")
    return {"benchmark": "serving", "base_url": base_url, "served_model_name": model_name,
            "num_prompts": args.num_prompts, "input_len": args.input_len,
            "output_len": args.output_len, "random_range_ratio": args.random_range_ratio,
            "request_rate": args.request_rate,
            "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
            "client_processes": processes,
            **metrics, "errors": errors[:5]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.base_url is not None:
        result = benchmark(args.base_url.rstrip("/"), args)
    else:
        flags = server_flags(engine_kwargs(args)) + list(args.server_arg)
        with launched_server(args.model, flags, args.server_timeout,
                             args.server_log) as (base_url, pid):
            result = benchmark(base_url, args, server_pid=pid)
    result["device"] = device_info()
    result["args"] = vars(args)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
