"""benchmarks/benchmark_latency.py on the tiny config: latency stats, decode time, roofline."""
from __future__ import annotations

import json
import statistics

import pytest
from transformers import AutoConfig

from benchmarks import benchmark_latency
from benchmarks.decode_bytes import decode_bytes_per_step
from benchmarks.utils import CONFIGS_DIR, parse_dtype, weight_bytes_per_token

TINY = ["--config", "tiny-llama", "--batch-size", "2", "--input-len", "8", "--output-len", "4",
        "--num-iters", "3", "--num-iters-warmup", "1"]


def check_latency(res: dict, num_iters: int, output_len: int) -> None:
    lat = res["latencies"]
    assert len(lat) == num_iters and all(x > 0 for x in lat)
    assert res["avg_latency"] == pytest.approx(statistics.fmean(lat))
    assert res["p50_latency"] == pytest.approx(statistics.median(lat))
    pcts = [res["percentiles"][k] for k in ("10", "25", "50", "75", "90", "99")]
    assert pcts == sorted(pcts) and min(lat) <= pcts[0] and pcts[-1] <= max(lat)
    assert res["p90_latency"] == res["percentiles"]["90"]
    assert res["p99_latency"] == res["percentiles"]["99"]
    assert res["prefill_latency_p50"] > 0
    expected = max(res["p50_latency"] - res["prefill_latency_p50"], 0) / (output_len - 1)
    assert res["decode_time_per_token"] == pytest.approx(expected)


def test_hf_backend_with_roofline(capsys):
    result = benchmark_latency.main([*TINY, "--backend", "hf", "--roofline",
                                     "--copy-bytes", str(8 << 20)])
    assert json.loads(capsys.readouterr().out) == result
    assert result["benchmark"] == "latency" and list(result["results"]) == ["hf"]
    check_latency(result, 3, 4)
    hf = result["results"]["hf"]
    roof = result["roofline"]
    cfg = AutoConfig.from_pretrained(CONFIGS_DIR / "tiny-llama")
    dtype = parse_dtype(result["dtype"])
    assert roof["weight_bytes_per_token"] == weight_bytes_per_token(cfg, dtype)["weight_bytes_per_token"]
    expected_bytes = decode_bytes_per_step(cfg, dtype, 2, 8, 4)["bytes_per_step"]  # TINY's batch and lengths
    assert roof["bytes_per_step"] == expected_bytes > roof["weight_bytes_per_token"]
    assert roof["copy_bandwidth_bytes_per_s"] > 0
    if hf["decode_time_per_token"] > 0:
        achieved = expected_bytes / hf["decode_time_per_token"]
        assert roof["achieved_bandwidth_bytes_per_s"] == pytest.approx(achieved)
        assert roof["fraction_of_roofline"] == pytest.approx(
            achieved / roof["copy_bandwidth_bytes_per_s"])
        assert hf["decode_tokens_per_second"] == pytest.approx(2 / hf["decode_time_per_token"])


def test_prompts_are_fresh_per_iteration_and_shared_by_backends():
    args = benchmark_latency.parse_args(TINY)
    prompts = benchmark_latency._Prompts(args, vocab_size=512)
    first = [prompts.next() for _ in range(3)]
    assert first[0] != first[1] != first[2]
    prompts.reset()
    assert [prompts.next() for _ in range(3)] == first


@pytest.mark.parametrize("argv,field", [(["--num-iters", "0"], "--num-iters"),
                                        (["--batch-size", "0"], "--batch-size"),
                                        (["--num-iters-warmup", "-1"], "--num-iters-warmup")])
def test_rejects_bad_counts(argv, field):
    with pytest.raises(ValueError, match=field):
        benchmark_latency.parse_args([*TINY, *argv])


def test_engine_against_hf(capsys):
    pytest.importorskip("vllm_volta.engine.llm_engine")
    result = benchmark_latency.main([*TINY, "--compare-hf", "--roofline",
                                     "--copy-bytes", str(8 << 20)])
    assert json.loads(capsys.readouterr().out) == result
    assert list(result["results"]) == ["vllm-volta", "hf"]
    ours, hf = result["results"]["vllm-volta"], result["results"]["hf"]
    check_latency(ours, 3, 4)
    check_latency(hf, 3, 4)
    assert result["speedup_vs_hf"]["p50_latency"] == pytest.approx(
        hf["p50_latency"] / ours["p50_latency"])
    assert result["roofline"]["fraction_of_roofline"] == ours["roofline"]["fraction_of_roofline"]


def test_roofline_bytes_of_a_4bit_checkpoint():
    """The shipped Llama-3-8B AWQ config: the 32 layers' 6.98e9 linear weights at half a byte plus
    a float16 scale and a 4-bit zero per 128, the lm_head (525M) in float16, one embedding row."""
    import torch
    import transformers

    dense = transformers.LlamaConfig(**json.loads((CONFIGS_DIR / "llama-3-8b" / "config.json").read_text()))
    awq = transformers.LlamaConfig(**json.loads((CONFIGS_DIR / "llama-3-8b-awq" / "config.json").read_text()))
    fp16 = weight_bytes_per_token(dense, torch.float16)
    q4 = weight_bytes_per_token(awq, torch.float16)
    assert q4["num_parameters"] == fp16["num_parameters"]
    linear = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)
    assert fp16["weight_bytes_per_token"] - q4["weight_bytes_per_token"] == pytest.approx(
        linear * 2 - (linear * 0.5 + linear / 128 * 2.5))


def test_decode_bytes_count_active_experts_kv_and_state():
    """Against the configs' numbers: the KV cache of every attention layer at the mean context, a
    hybrid model's recurrent state read and written, and only the routed experts of a MoE model."""
    import torch
    import transformers

    def config(name):
        d = json.loads((CONFIGS_DIR / name / "config.json").read_text())
        return transformers.AutoConfig.for_model(d.pop("model_type"), **d)

    llama = config("llama-3-8b")
    out = decode_bytes_per_step(llama, torch.float16, 4, 128, 513)
    assert out["kv_bytes_per_step"] == 4 * 32 * (128 + 256) * 2 * 8 * 128 * 2
    assert out["state_bytes_per_step"] == 0
    assert out["weight_bytes_per_step"] == weight_bytes_per_token(llama, torch.float16)["weight_bytes_per_token"]

    qwen35 = config("qwen3.5-9b")  # 24 Gated DeltaNet layers, 8 full-attention layers
    out = decode_bytes_per_step(qwen35, torch.float16, 1, 128, 1)
    conv = (2 * 16 * 128 + 32 * 128) * 3
    assert out["state_bytes_per_step"] == 24 * 2 * (32 * 128 * 128 * 4 + conv * 2)
    assert out["kv_bytes_per_step"] == 8 * 128 * 2 * 4 * 256 * 2

    moe = config("qwen3-30b-a3b")  # 48 layers of 128 experts (gate, up, down: 3 x 2048 x 768), top 8
    experts = 48 * 128 * 3 * 2048 * 768 * 2
    total = weight_bytes_per_token(moe, torch.float16)["weight_bytes_per_token"]
    for batch in (1, 64):
        used = 128 * (1 - (1 - 8 / 128) ** batch)
        got = decode_bytes_per_step(moe, torch.float16, batch, 128, 1)["weight_bytes_per_step"]
        assert got == pytest.approx(total - experts * (1 - used / 128))
