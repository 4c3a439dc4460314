"""The engine on GPTQ (activation order, 8-bit) and compressed-tensors checkpoints: greedy tokens
on the CPU, and on a GPU the fp16 engine (CUDA graphs; awq_gemv at decode and awq_dequantize +
cuBLAS in prefill for the 4-bit layers, PyTorch dequantization + cuBLAS for 8-bit) against
transformers running the dequantized weights."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models.hf_compare import TINY, check_engine_logprobs, save_random_hf_model

from .checkpoints import check_engine_greedy
from .int_checkpoints import Scheme, quantize_hf_model

CT = "compressed-tensors"
GPU_SCHEMES = {
    "gptq-act-order-4bit": Scheme("gptq", bits=4, group=64, act_order=True, fmt="gptq"),
    "gptq-8bit-sym": Scheme("gptq", bits=8, group=64, sym=True, fmt="gptq_v2"),
    "ct-w4a16-group-asym": Scheme(CT, bits=4, group=64),
    "ct-w4a16-actorder-sym": Scheme(CT, bits=4, group=64, sym=True, act_order=True),
    "ct-w8a16-channel-sym": Scheme(CT, bits=8, group=-1, sym=True),
}


@pytest.mark.parametrize("scheme", [Scheme("gptq", bits=4, group=32, act_order=True),
                                    Scheme(CT, bits=8, group=32, ignore=("model.layers.1.mlp.down_proj",))],
                         ids=["gptq-act-order", "ct-w8a16-ignore"])
def test_engine_greedy_matches_transformers(tmp_path, scheme):
    """The engine (float32 on the CPU, chunked prefill next to decodes) generates transformers'
    greedy tokens of the same weights dense."""
    hf = save_random_hf_model(transformers.LlamaConfig(**{**TINY, "vocab_size": 384}), tmp_path / "dense")
    quantize_hf_model(hf, tmp_path, scheme)
    check_engine_greedy(tmp_path, hf, scheme.method)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(GPU_SCHEMES))
def test_fp16_engine_logprobs_match_transformers(tmp_path, name):
    # The vocabulary of tiny_models.random_prompts (ids up to 383).
    config = transformers.LlamaConfig(**{**TINY, "hidden_size": 256, "intermediate_size": 512,
                                         "num_attention_heads": 4, "num_key_value_heads": 2,
                                         "vocab_size": 384})
    hf = save_random_hf_model(config, tmp_path / "dense")
    with torch.no_grad():  # weights of a trained model's size, so fp16 noise stays small
        for p in hf.parameters():
            p.mul_(0.3)
    quantize_hf_model(hf, tmp_path, GPU_SCHEMES[name])
    check_engine_logprobs(tmp_path, hf)
