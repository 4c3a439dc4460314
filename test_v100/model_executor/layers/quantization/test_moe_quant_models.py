"""Quantized Qwen3-MoE models against transformers on the dequantized weights: our model on CPU
(chunked prefill, decode batches, prefix hits) and, on a GPU, the float16 engine with CUDA graphs
(4-bit experts through the moe_w4 GEMVs and the dequantized chunks; FP8 experts gathered), every
logprob within float16 noise of transformers' float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from test_v100.model_executor.layers.quantization.test_moe_quant_engine import _quantize_folder, cpu_only
from test_v100.model_executor.models.hf_compare import (check_engine_logprobs, check_mixed_batch, load_ours,
                                                        save_random_hf_model)


def _qwen3_moe(tmp_path: Path, scheme: tuple[str, str]):
    """A random Qwen3-MoE (16 experts, top 4) quantized in ``scheme``: (folder, transformers' model
    on the dequantized weights)."""
    import transformers

    cfg = transformers.Qwen3MoeConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=120, max_position_embeddings=256, rms_norm_eps=1e-5, head_dim=64,
                                      intermediate_size=192, num_experts=16, num_experts_per_tok=4,
                                      moe_intermediate_size=96, norm_topk_prob=True)
    save_random_hf_model(cfg, tmp_path / "src")
    _quantize_folder(tmp_path / "src", tmp_path / "quant", tmp_path / "dense", scheme)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", attn_implementation="eager")
    return tmp_path / "quant", hf.float().eval()


@cpu_only
def test_model_matches_transformers_on_the_dequantized_weights(tmp_path):
    folder, hf = _qwen3_moe(tmp_path, ("w4", "awq"))
    check_mixed_batch(load_ours(folder), hf, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", [("w4", "awq"), ("fp8", "block")], ids=["awq", "fp8-block"])
def test_gpu_engine_with_cuda_graphs_matches_transformers(tmp_path, scheme):
    check_engine_logprobs(*_qwen3_moe(tmp_path, scheme))  # asserts the decode graphs were captured
