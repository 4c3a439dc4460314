"""benchmarks/utils.py and benchmarks/cli_args.py: prompts, statistics, bandwidth, weight bytes."""
from __future__ import annotations

import json
import statistics

import pytest
import torch
from transformers import AutoConfig

from benchmarks import utils
from benchmarks.benchmark_throughput import parse_args
from benchmarks.cli_args import engine_kwargs
from benchmarks.server_launcher import server_flags


def test_random_token_prompts_shape_range_and_seed():
    prompts = utils.random_token_prompts(5, 7, 11, seed=3)
    assert len(prompts) == 5 and all(len(p) == 7 for p in prompts)
    assert all(0 <= t < 11 for p in prompts for t in p)
    assert all(isinstance(t, int) for t in prompts[0])
    assert prompts == utils.random_token_prompts(5, 7, 11, seed=3)
    assert prompts != utils.random_token_prompts(5, 7, 11, seed=4)


def test_random_lengths_follow_the_range_ratio():
    assert utils.random_lengths(6, 100, 0.0, seed=1) == [100] * 6
    lengths = utils.random_lengths(2000, 100, 0.5, seed=1)
    assert min(lengths) == 50 and max(lengths) == 150  # both ends included (vLLM's range)
    assert abs(statistics.fmean(lengths) - 100) < 3
    assert lengths == utils.random_lengths(2000, 100, 0.5, seed=1)
    assert min(utils.random_lengths(50, 1, 0.9, seed=0)) == 1  # never below one token
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="random-range-ratio"):
            utils.random_lengths(3, 10, bad, seed=0)
    prompts = utils.random_token_prompts(3, 7, 11, seed=3, lengths=[2, 9, 4])
    assert [len(p) for p in prompts] == [2, 9, 4] and all(0 <= t < 11 for p in prompts for t in p)


@pytest.mark.parametrize("kwargs,field", [({"num_prompts": 0}, "num_prompts"),
                                          ({"input_len": 0}, "input_len"),
                                          ({"vocab_size": 0}, "vocab_size")])
def test_random_token_prompts_rejects_bad_sizes(kwargs, field):
    args = {"num_prompts": 2, "input_len": 3, "vocab_size": 10, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=field):
        utils.random_token_prompts(**args)


def test_summarize_matches_statistics_module():
    values = [0.3, 1.7, 0.9, 2.4, 0.1, 5.0, 1.1]
    out = utils.summarize(values, (25, 50, 90), scale=1000, name="ttft_ms")
    # statistics.quantiles(method="inclusive") is the same linear interpolation as numpy's default.
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert out["mean_ttft_ms"] == pytest.approx(statistics.fmean(values) * 1000)
    assert out["median_ttft_ms"] == pytest.approx(statistics.median(values) * 1000)
    assert out["std_ttft_ms"] == pytest.approx(statistics.pstdev(values) * 1000)
    for p in (25, 50, 90):
        assert out[f"p{p}_ttft_ms"] == pytest.approx(cuts[p - 1] * 1000)
    assert set(utils.summarize([1.0], (99,))) == {"mean", "median", "std", "p99"}
    with pytest.raises(ValueError, match="percentile"):
        utils.summarize([1.0], (101,))


def test_resolve_model():
    shipped = utils.resolve_model(None, "tiny-llama")
    assert shipped == str(utils.CONFIGS_DIR / "tiny-llama")
    assert utils.resolve_model(None, shipped + "/config.json") == shipped
    assert utils.resolve_model("org/name", None) == "org/name"
    with pytest.raises(ValueError, match="exactly one"):
        utils.resolve_model(None, None)
    with pytest.raises(ValueError, match="llama-3-8b"):
        utils.resolve_model(None, "no-such-config")


def test_shipped_configs_have_the_real_shapes():
    expected = {  # parameter counts of the published checkpoints
        "llama-3-8b": 8_030_261_248,
        "qwen2.5-1.5b": 1_543_714_304,
        "qwen2.5-7b": 7_615_616_512,
    }
    assert set(expected) | {"tiny-llama"} <= set(utils.shipped_configs())
    for name, params in expected.items():
        cfg = AutoConfig.from_pretrained(utils.CONFIGS_DIR / name)
        got = utils.weight_bytes_per_token(cfg, torch.float16)
        assert got["num_parameters"] == params, name


def _hand_count_weights_read(cfg) -> int:
    """Llama-shaped decode step: every layer weight, final norm, LM head, one embedding row."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    hd = h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h
    bias = (q + 2 * kv) if cfg.model_type == "qwen2" else 0
    layers = cfg.num_hidden_layers * (per_layer + bias)
    lm_head = cfg.vocab_size * h
    embed_read = 0 if cfg.tie_word_embeddings else h
    return layers + h + lm_head + embed_read


@pytest.mark.parametrize("name", ["tiny-llama", "qwen2.5-1.5b", "llama-3-8b"])
@pytest.mark.parametrize("dtype,size", [(torch.float16, 2), (torch.float32, 4)])
def test_weight_bytes_per_token_by_hand(name, dtype, size):
    cfg = AutoConfig.from_pretrained(utils.CONFIGS_DIR / name)
    got = utils.weight_bytes_per_token(cfg, dtype)["weight_bytes_per_token"]
    assert got == _hand_count_weights_read(cfg) * size


def test_copy_bandwidth_on_cpu():
    out = utils.measure_copy_bandwidth("cpu", nbytes=4 << 20, iters=3, warmup=1)
    assert out["copy_bytes"] == 4 << 20
    assert out["bandwidth_bytes_per_s"] == pytest.approx(2 * out["copy_bytes"]
                                                         / out["seconds_per_copy"])
    with pytest.raises(ValueError, match="copy_bytes"):
        utils.measure_copy_bandwidth("cpu", nbytes=1000)


def test_run_and_emit_prints_one_document(capsys, tmp_path):
    path = tmp_path / "out.json"

    def noisy_run():
        print("library chatter")  # must not reach stdout
        return {"rate": float("inf"), "values": [1.5, float("nan")]}

    result = utils.run_and_emit(noisy_run, str(path))
    captured = capsys.readouterr()
    assert json.loads(captured.out) == result == {"rate": "inf", "values": [1.5, "nan"]}
    assert "library chatter" in captured.err
    assert json.loads(path.read_text()) == result


def test_engine_kwargs_and_server_flags():
    args = parse_args(["--config", "tiny-llama", "--dtype", "half", "--max-num-seqs", "4",
                       "--enforce-eager", "--cudagraph-mode", "FULL_DECODE_ONLY",
                       "--cudagraph-metrics", "--cuda-graph-sizes", "1", "2"])
    kwargs = engine_kwargs(args)
    assert kwargs == {"model": str(utils.CONFIGS_DIR / "tiny-llama"), "load_format": "dummy",
                      "seed": 0, "dtype": "half", "max_num_seqs": 4, "enforce_eager": True,
                      "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_metrics": True,
                      "cuda_graph_sizes": [1, 2], "skip_tokenizer_init": True}
    assert server_flags(kwargs) == ["--load-format", "dummy", "--seed", "0", "--dtype", "half",
                                    "--max-num-seqs", "4", "--enforce-eager",
                                    "--cudagraph-mode", "FULL_DECODE_ONLY", "--cudagraph-metrics",
                                    "--cuda-graph-sizes", "1", "2", "--skip-tokenizer-init"]
    real = parse_args(["--model", "some/model"])
    assert real.load_format == "auto" and "skip_tokenizer_init" not in engine_kwargs(real)
    with pytest.raises(ValueError, match="--num-prompts must be >= 1"):
        parse_args(["--config", "tiny-llama", "--num-prompts", "0"])


def test_device_info_names_the_mode_and_path_switches(monkeypatch):
    monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    monkeypatch.setenv("VLLM_VOLTA_CUDA_GRAPH_CAPTURE", "torch")
    monkeypatch.delenv("VLLM_VOLTA_DECODE_GEMV", raising=False)
    info = utils.device_info()
    assert info["VLLM_VOLTA_DEVICE_CAPABILITY"] == "7.0"
    assert info["VLLM_VOLTA_CUDA_GRAPH_CAPTURE"] == "torch"
    assert info["VLLM_VOLTA_DECODE_GEMV"] is None
    assert info["torch"] == torch.__version__ and "extension" in info


def _linear_weights(cfg) -> int:
    h, inter = cfg.hidden_size, cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return cfg.num_hidden_layers * (h * q + 2 * h * kv + q * h + 3 * h * inter)


@pytest.mark.parametrize("name,per_weight", [
    ("llama-3-8b-awq", 0.5 + (2 + 0.5) / 128),  # 4 bits, an fp16 scale and a 4-bit zero per 128
    ("qwen3-8b-fp8", 1 + 4 / (128 * 128)),  # one byte, an fp32 scale per 128 x 128 block
])
def test_quantized_weight_bytes_by_hand(name, per_weight):
    """The decoder's linear layers read their packed bytes; everything else stays float16."""
    cfg = AutoConfig.from_pretrained(utils.CONFIGS_DIR / name)
    dense_cfg = AutoConfig.from_pretrained(utils.CONFIGS_DIR / name)
    del dense_cfg.quantization_config
    dense = utils.weight_bytes_per_token(dense_cfg, torch.float16)["weight_bytes_per_token"]
    got = utils.weight_bytes_per_token(cfg, torch.float16)["weight_bytes_per_token"]
    assert got == pytest.approx(dense - _linear_weights(cfg) * (2 - per_weight), rel=1e-12)
