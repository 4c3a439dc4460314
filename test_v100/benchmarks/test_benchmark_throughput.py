"""benchmarks/benchmark_throughput.py on the tiny config: JSON schema and consistent numbers."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig

from benchmarks import benchmark_throughput
from benchmarks.backends import standalone_hf_dtype

TINY = ["--config", "tiny-llama", "--input-len", "12", "--output-len", "5", "--num-prompts", "6"]
METRICS = ("elapsed_time", "num_requests", "total_prompt_tokens", "total_output_tokens",
           "total_num_tokens", "requests_per_second", "output_tokens_per_second",
           "tokens_per_second")


def check_metrics(res: dict, num_prompts: int, input_len: int, output_len: int) -> None:
    """Counts are exact; rates are those counts over the elapsed time."""
    assert set(METRICS) <= set(res)
    assert res["num_requests"] == num_prompts
    assert res["total_prompt_tokens"] == num_prompts * input_len
    assert res["total_output_tokens"] == num_prompts * output_len
    assert res["total_num_tokens"] == num_prompts * (input_len + output_len)
    assert res["elapsed_time"] > 0
    t = res["elapsed_time"]
    assert res["requests_per_second"] == pytest.approx(num_prompts / t)
    assert res["output_tokens_per_second"] == pytest.approx(num_prompts * output_len / t)
    assert res["tokens_per_second"] == pytest.approx(res["total_num_tokens"] / t)


def test_hf_backend(capsys):
    result = benchmark_throughput.main([*TINY, "--backend", "hf", "--hf-batch-size", "4"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["benchmark"] == "throughput" and result["backend"] == "hf"
    assert list(result["results"]) == ["hf"]
    check_metrics(result, 6, 12, 5)
    check_metrics(result["results"]["hf"], 6, 12, 5)
    # 'auto' alone: the dtype the platform picks for this config (float32 on CPU).
    cfg = AutoConfig.from_pretrained(result["model"])
    expected = str(standalone_hf_dtype("auto", cfg)).removeprefix("torch.")
    assert result["results"]["hf"]["dtype"] == expected
    if not torch.cuda.is_available():
        assert expected == "float32"
    assert "ratio_vs_hf" not in result


def test_hf_backend_explicit_dtype(capsys):
    # The script as a subprocess (stdout = one JSON document) is covered by test_benchmark_modes.
    result = benchmark_throughput.main([*TINY, "--backend", "hf", "--dtype", "half"])
    assert result["dtype"] == "float16"
    check_metrics(result, 6, 12, 5)


@pytest.mark.parametrize("argv,field", [(["--num-prompts", "0"], "--num-prompts"),
                                        (["--hf-batch-size", "0"], "--hf-batch-size"),
                                        (["--output-len", "-1"], "--output-len")])
def test_rejects_bad_counts(argv, field):
    with pytest.raises(ValueError, match=field):
        benchmark_throughput.parse_args([*TINY, *argv])


def test_engine_against_hf(capsys):
    pytest.importorskip("vllm_volta.engine.llm_engine")
    result = benchmark_throughput.main([*TINY, "--compare-hf", "--hf-batch-size", "3",
                                        "--max-num-seqs", "4"])
    assert json.loads(capsys.readouterr().out) == result
    assert list(result["results"]) == ["vllm-volta", "hf"]
    ours, hf = result["results"]["vllm-volta"], result["results"]["hf"]
    check_metrics(result, 6, 12, 5)
    check_metrics(ours, 6, 12, 5)
    check_metrics(hf, 6, 12, 5)
    assert ours["dtype"] == hf["dtype"]  # the reference runs in the dtype the engine chose
    for key, value in result["ratio_vs_hf"].items():
        assert value == pytest.approx(ours[key] / hf[key])
