"""benchmarks/benchmark_serving.py end to end: it starts `vllm-volta serve` on the tiny config
(random weights; without a tokenizer, and with a small word-level one), streams token-id
prompts, measures, and stops the server."""
from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import benchmark_serving, serving_client
from benchmarks.utils import CONFIGS_DIR


def _tiny_with_tokenizer(folder) -> list[str]:
    """tiny-llama's config plus a word-level tokenizer covering its 512 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    shutil.copy(CONFIGS_DIR / "tiny-llama" / "config.json", folder / "config.json")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(512)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token="w1",
                            eos_token="w2").save_pretrained(folder)
    return ["--model", str(folder), "--tokenizer", str(folder), "--load-format", "dummy"]


@pytest.mark.parametrize("tokenizer", [False, True], ids=["no-tokenizer", "tokenizer"])
def test_launches_our_server_and_measures(capsys, tmp_path, tokenizer):
    model = _tiny_with_tokenizer(tmp_path) if tokenizer else ["--config", "tiny-llama"]
    server_log = tmp_path / "server.log"
    # Without a tokenizer, the server also logs how its steps ran, and its log is kept.
    extra = [] if tokenizer else ["--cudagraph-metrics", "--server-log", str(server_log)]
    result = benchmark_serving.main([
        *model, "--max-model-len", "64", "--num-prompts", "5", "--input-len", "7",
        "--output-len", "4", "--ignore-eos", "--request-rate", "50", "--max-concurrency", "3",
        "--server-timeout", "240", *extra])
    assert json.loads(capsys.readouterr().out) == result
    if not tokenizer:  # the server took the flag (an unknown one stops it) and kept its log
        assert "KV cache" in server_log.read_text()
        assert '"POST /v1/completions HTTP/1.1" 200' in server_log.read_text()  # access log
    assert result["completed"] == 5 and result["failed"] == 0, result["errors"]
    assert result["total_input_tokens"] == 5 * 7
    assert result["total_output_tokens"] == 5 * 4
    assert result["request_throughput"] == pytest.approx(5 / result["duration"])
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert result[f"mean_{metric}_ms"] > 0
        assert result[f"p99_{metric}_ms"] >= result[f"p50_{metric}_ms"]
    assert result["mean_ttft_ms"] <= result["mean_e2el_ms"]
    assert result["max_concurrency"] == 3 and result["served_model_name"]
    # The server this run started: its CPU time over the requests (on CPU, the engine runs in
    # the server's process, so the front end counts it all).
    assert result["server_cpu"]["frontend_cpu_s"] > 0
    assert result["server_cpu"]["frontend_cpu_us_per_output_token"] == pytest.approx(
        result["server_cpu"]["frontend_cpu_s"] / (5 * 4) * 1e6)


def test_random_range_ratio_varies_each_requests_lengths(capsys, tmp_path):
    from benchmarks.utils import random_lengths

    args = ["--config", "tiny-llama", "--max-model-len", "96", "--num-prompts", "6",
            "--input-len", "10", "--output-len", "8", "--random-range-ratio", "0.5",
            "--ignore-eos", "--max-concurrency", "3", "--seed", "5", "--server-timeout", "240",
            "--server-arg=--disable-uvicorn-access-log", "--server-log", str(tmp_path / "server.log")]
    result = benchmark_serving.main(args)
    capsys.readouterr()
    assert result["completed"] == 6 and result["random_range_ratio"] == 0.5
    # The lengths the benchmark drew (its seeds), every output run to its max_tokens.
    inputs, outputs = random_lengths(6, 10, 0.5, 7), random_lengths(6, 8, 0.5, 8)
    assert len(set(inputs)) > 1 and len(set(outputs)) > 1
    assert result["total_input_tokens"] == sum(inputs)
    assert result["total_output_tokens"] == sum(outputs)
    # The server was started without its access log.
    assert "POST /v1/completions" not in (tmp_path / "server.log").read_text()
    with pytest.raises(ValueError, match="random-range-ratio"):
        benchmark_serving.parse_args(["--config", "tiny-llama", "--random-range-ratio", "1"])


def test_probe_request_shares_no_prompt_with_the_timed_requests(monkeypatch):
    """The untimed first request must not leave a timed prompt in the server's prefix cache."""
    sent = []

    async def fake_send(client, url, payload):
        sent.append(payload)
        return benchmark_serving.RequestResult(prompt_len=len(payload["prompt"]), success=True,
                                               ttft=0.01, latency=0.02, itl=[0.01],
                                               output_tokens=payload["max_tokens"])

    monkeypatch.setattr(benchmark_serving, "send_completion", fake_send)
    monkeypatch.setattr(serving_client, "send_completion", fake_send)
    monkeypatch.setattr(benchmark_serving, "_served_model", lambda url, name: "m")
    args = benchmark_serving.parse_args(["--config", "tiny-llama", "--base-url", "http://x",
                                         "--num-prompts", "4", "--input-len", "9", "--output-len", "3"])
    benchmark_serving.benchmark("http://x", args)
    probe, timed = sent[0], sent[1:]
    assert probe["max_tokens"] == 4 and len(probe["prompt"]) == 9 and len(timed) == 4
    assert tuple(probe["prompt"]) not in {tuple(p["prompt"]) for p in timed}
