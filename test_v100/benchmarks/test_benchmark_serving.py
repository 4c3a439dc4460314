"""benchmarks/benchmark_serving.py end to end: it starts `vllm-volta serve` on the tiny config
(random weights, no tokenizer), streams token-id prompts and stops the server."""
from __future__ import annotations

import json

import pytest

from benchmarks import benchmark_serving


def test_launches_our_server_and_measures(capsys):
    result = benchmark_serving.main([
        "--config", "tiny-llama", "--max-model-len", "64", "--num-prompts", "5",
        "--input-len", "7", "--output-len", "4", "--ignore-eos", "--request-rate", "50",
        "--max-concurrency", "3", "--server-timeout", "240"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["completed"] == 5 and result["failed"] == 0, result["errors"]
    assert result["total_input_tokens"] == 5 * 7
    assert result["total_output_tokens"] == 5 * 4
    assert result["request_throughput"] == pytest.approx(5 / result["duration"])
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert result[f"mean_{metric}_ms"] > 0
        assert result[f"p99_{metric}_ms"] >= result[f"p50_{metric}_ms"]
    assert result["mean_ttft_ms"] <= result["mean_e2el_ms"]
    assert result["max_concurrency"] == 3 and result["served_model_name"]
