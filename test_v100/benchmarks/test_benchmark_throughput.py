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


def test_step_stats_split_prefill_and_decode_steps():
    pytest.importorskip("vllm_volta.engine.llm_engine")
    result = benchmark_throughput.main([*TINY, "--step-stats", "--max-num-seqs", "6"])
    ours = result["results"]["vllm-volta"]
    stats = ours["step_stats"]
    # 6 prompts x 12 tokens fit one step's token budget; that step also samples each first
    # token, so 4 decode-only steps make the other output tokens.
    assert stats["prefill_steps"]["count"] == 1
    assert stats["decode_steps"]["count"] == 4
    total = stats["prefill_steps"]["seconds"] + stats["decode_steps"]["seconds"]
    assert 0 < total <= ours["elapsed_time"]
    decode = stats["decode_steps"]
    assert decode["ms_mean"] == pytest.approx(1e3 * decode["seconds"] / 4)
    assert decode["ms_median"] <= decode["ms_p90"] <= decode["ms_max"]
    assert set(decode["gc"]) == {"steps_with_collections", "ms_total", "ms_max"}
    for kind in stats.values():
        host = kind["host_ms_mean"]
        assert list(host) == ["schedule", "launch", "wait", "finish"]
        # Every phase ran in every step, inside the step's wall time.
        assert all(v > 0 for v in host.values()), host
        assert sum(host.values()) <= kind["ms_mean"]


@pytest.mark.parametrize("async_flag", [[], ["--async-scheduling"]], ids=["sync", "async"])
def test_step_stats_count_chunked_prefill_steps_as_prefill(async_flag):
    pytest.importorskip("vllm_volta.engine.llm_engine")
    # 16 tokens per step, shared with the decodes of prompts already prefilled: steps 1-6 run
    # 16, 16, 16, 16, 16 and 7 tokens, each with prompt tokens (the 6th prompt's last 2); the
    # 6th request's 4 other output tokens then take 4 decode-only steps (async scheduling: one
    # more call, which applies the last launched step).
    result = benchmark_throughput.main([*TINY, "--step-stats", "--max-num-batched-tokens", "16",
                                        *async_flag])
    stats = result["results"]["vllm-volta"]["step_stats"]
    assert stats["prefill_steps"]["count"] == 6
    assert stats["decode_steps"]["count"] == (5 if async_flag else 4)


def test_no_step_stats_by_default():
    pytest.importorskip("vllm_volta.engine.llm_engine")
    result = benchmark_throughput.main([*TINY, "--num-prompts", "2"])
    assert "step_stats" not in result["results"]["vllm-volta"]


def test_step_stats_percentiles_and_gc_pauses_from_records():
    steps = [(False, t / 1e3, {"schedule": 0.001, "gc": g})
             for t, g in [(10, 0.0), (11, 0.0), (12, 0.002), (13, 0.0), (50, 0.030)]]
    steps += [(True, 0.08, {"launch": 0.05})]
    stats = benchmark_throughput.step_stats(steps)
    decode = stats["decode_steps"]
    assert decode["count"] == 5 and decode["ms_median"] == pytest.approx(12)
    assert decode["ms_p90"] == pytest.approx(13) and decode["ms_max"] == pytest.approx(50)
    assert decode["gc"] == {"steps_with_collections": 2, "ms_total": pytest.approx(32),
                            "ms_max": pytest.approx(30)}
    assert decode["host_ms_mean"]["schedule"] == pytest.approx(1)
    assert stats["prefill_steps"]["gc"]["steps_with_collections"] == 0


def test_warm_up_shares_no_prompt_with_the_timed_run(monkeypatch):
    """The engine's prefix cache must not start the timed run holding some of its prompts."""
    calls = []

    class Recorder:
        name, device, dtype = "hf", None, torch.float32

        def generate(self, prompts, output_len, **kwargs):
            calls.append([tuple(p) for p in prompts])
            return [output_len] * len(prompts)

    monkeypatch.setattr(benchmark_throughput, "iter_runners", lambda *args: iter([Recorder()]))
    benchmark_throughput.main([*TINY, "--backend", "hf"])
    warmup, timed = calls
    assert len(warmup) == 2 and all(len(p) == 12 for p in warmup)
    assert not set(warmup) & set(timed)
