"""benchmarks/make_gguf_model.py and benchmark_gguf_decode.py without a GPU: llama.cpp's Q4_K_M type
choice, a written file that loads (blocks decode to finite weights of the intended size), the
decode timing on a tiny model on the CPU, argument checks and the CUDA requirement."""

from __future__ import annotations

import pytest
import torch

from benchmarks import benchmark_gguf_decode as bench
from benchmarks import make_gguf_model as make
from vllm_volta.model_executor.model_loader.gguf_blocks import block_qtype
from vllm_volta.model_executor.model_loader.gguf_loader import iterate_gguf_weights

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}


def test_q4_k_m_gives_attn_v_and_ffn_down_q6_k_on_llama_cpp_layers():
    # 32 layers: the first and last 4, and every third layer between (from layer 6).
    assert [i for i in range(32) if make.more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert make.tensor_type("Q4_K_M", "attn_q", 0, 32).name == "Q4_K"
    assert make.tensor_type("Q4_K_M", "ffn_down", 6, 32).name == "Q6_K"
    assert make.tensor_type("Q4_K_M", "ffn_down", 7, 32).name == "Q4_K"
    assert make.tensor_type("Q4_K_M", "output", 0, 32).name == "Q6_K"
    assert make.tensor_type("Q8_0", "attn_v", 0, 32).name == "Q8_0"


def test_written_file_loads_with_finite_small_weights(tmp_path):
    path = tmp_path / "m.gguf"
    counts = make.write_model(TINY, "Q4_K_M", path)
    assert counts == {"Q6_K": 1 + 2 * 4, "Q4_K": 7 * 8 - 2 * 4}  # head + attn_v / ffn_down of layers 0, 3, 6, 7
    blocks = dict(iterate_gguf_weights(path, use_tqdm=False, keep_quantized=True))
    dense = dict(iterate_gguf_weights(path, use_tqdm=False))
    assert block_qtype(blocks["model.layers.3.mlp.down_proj.weight"]).name == "Q6_K"
    for name, w in dense.items():
        assert torch.isfinite(w).all(), name
        if name.endswith("proj.weight"):
            assert 0.002 < float(w.float().std()) < 0.1, name


def test_decode_timing_on_the_cpu(tmp_path):
    path = tmp_path / "m.gguf"
    make.write_model(TINY, "Q8_0", path)
    args = bench.parse_args(["--output-len", "3", "--num-iters", "1", "--input-len", "4"])
    result = bench.decode_seconds_per_token(args, TINY["vocab_size"], dtype="float32", model=str(path),
                                            cpu_kvcache_space=0.01)
    assert len(result["s_per_token"]) == 1 and result["median_s_per_token"] == result["s_per_token"][0]


def test_arguments_and_cuda_requirement(monkeypatch):
    with pytest.raises(ValueError, match="--output-len must be >= 2"):
        bench.parse_args(["--output-len", "1"])
    with pytest.raises(ValueError, match="--num-iters must be >= 1"):
        bench.parse_args(["--num-iters", "0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="benchmark_gguf_decode.py needs a CUDA GPU"):
        bench.run(bench.parse_args([]))
    with pytest.raises(ValueError, match="writes llama only"):
        make.main(["--config", "qwen3-30b-a3b", "/dev/null"])
