"""`vllm-volta bench latency | throughput | serve`: parsing, vLLM's flag spellings reaching the
benchmarks' own parsers, real tiny runs whose JSON is read back, and the message outside a
source checkout."""

from __future__ import annotations

import json

import pytest

from vllm_volta.entrypoints import cli_bench
from vllm_volta.entrypoints.cli import main, parse_args

TINY = ["--config", "tiny-llama", "--input-len", "4", "--output-len", "2"]


def test_subcommand_and_flags_are_passed_through():
    args = parse_args(["bench", "latency", "--batch-size", "2", "--num-iters", "3"])
    assert (args.command, args.bench_kind, args.bench_args) == (
        "bench", "latency", ["--batch-size", "2", "--num-iters", "3"])
    with pytest.raises(SystemExit):
        parse_args(["bench", "decode"])


@pytest.mark.parametrize("kind,argv,expected", [
    ("latency", ["--backend", "vllm", "--batch-size", "2"], ["--batch-size", "2", "--backend", "vllm-volta"]),
    ("throughput", ["--backend=hf"], ["--backend", "hf"]),
    ("serve", ["--backend", "vllm", "--dataset-name", "random", "--host", "127.0.0.1", "--port", "9001"],
     ["--base-url", "http://127.0.0.1:9001"]),
    ("serve", ["--port=8123", "--num-prompts", "4"], ["--num-prompts", "4", "--base-url", "http://localhost:8123"]),
    ("serve", ["--base-url", "http://h:1"], ["--base-url", "http://h:1"]),
])
def test_vllm_spellings_are_translated(kind, argv, expected):
    assert cli_bench.translate_vllm_flags(kind, argv) == expected


@pytest.mark.parametrize("kind,argv,match", [
    ("serve", ["--dataset-name", "sharegpt"], "--dataset-name 'sharegpt' is not supported; supported: random"),
    ("serve", ["--backend", "tgi"], "--backend 'tgi' is not supported by bench serve; supported: vllm, openai"),
    ("serve", ["--host", "h", "--base-url", "http://h:1"], "either --base-url or --host/--port"),
    ("serve", ["--port"], "--port needs a value"),
])
def test_unsupported_values_name_the_flag(kind, argv, match):
    with pytest.raises(ValueError, match=match):
        cli_bench.translate_vllm_flags(kind, argv)


def test_serve_flags_reach_the_serving_benchmarks_parser():
    bench = cli_bench.load_benchmark("serve").__module__
    import importlib

    parsed = importlib.import_module(bench).parse_args(cli_bench.translate_vllm_flags(
        "serve", ["--host", "127.0.0.1", "--port", "9001", "--random-input-len", "8",
                  "--num-prompts", "3", "--vocab-size", "100", "--max-concurrency", "2"]))
    assert (parsed.base_url, parsed.input_len, parsed.num_prompts, parsed.max_concurrency) == (
        "http://127.0.0.1:9001", 8, 3, 2)


@pytest.mark.parametrize("kind,extra,check", [
    ("latency", ["--batch-size", "1", "--num-iters", "1", "--num-iters-warmup", "0"],
     lambda r: r["benchmark"] == "latency" and r["batch_size"] == 1 and len(r["latencies"]) == 1),
    ("throughput", ["--num-prompts", "2"],
     lambda r: r["num_prompts"] == 2 and r["results"]["vllm-volta"]["output_tokens_per_second"] > 0),
])
def test_tiny_runs_print_their_json(kind, extra, check, capsys):
    main(["bench", kind, *TINY, "--backend", "vllm", *extra])
    result = json.loads(capsys.readouterr().out)
    assert (result["input_len"], result["output_len"]) == (4, 2) and check(result), result


def test_outside_a_source_checkout_the_message_says_what_to_do(monkeypatch):
    monkeypatch.setattr(cli_bench, "source_root", lambda: None)
    with pytest.raises(SystemExit, match="source checkout's benchmarks/ folder.*pip install -e ."):
        cli_bench.run_bench("latency", [])
