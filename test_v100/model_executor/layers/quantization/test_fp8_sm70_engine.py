"""The fp16 engine on FP8 checkpoints as a V100 runs them (VLLM_VOLTA_DEVICE_CAPABILITY=7.0: the SM70
FP8 kernels, CUDA graphs, the Volta attention backend): every prompt and generated token's logprob
within fp16 noise of transformers' (fp32) on the dequantized weights. GPU only."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models.hf_compare import TINY, check_engine_logprobs, save_random_hf_model
from vllm_volta import _custom_ops as ops

from .fp8_checkpoints import Fp8Scheme, quantize_hf_model

SCHEMES = {
    "fp8-block-128": Fp8Scheme("fp8", "block", (128, 128)),  # Qwen3-FP8's format
    "fp8-tensor-static": Fp8Scheme("fp8", "tensor", acts="static"),
    "ct-w8a16-channel": Fp8Scheme("compressed-tensors", "channel", acts=None),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(SCHEMES))
def test_fp16_engine_logprobs_match_transformers_in_volta_mode(tmp_path, monkeypatch, name):
    monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    calls: dict[str, int] = {}
    for op in ("fp8_gemv", "fp8_gemm", "fp8_dequantize"):
        def counted(*args, _op=op, _real=getattr(ops, op), **kwargs):
            calls[_op] = calls.get(_op, 0) + 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(ops, op, counted)
    # The vocabulary of tiny_models.random_prompts (ids up to 383).
    config = transformers.LlamaConfig(**{**TINY, "hidden_size": 256, "intermediate_size": 512,
                                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384})
    hf = save_random_hf_model(config, tmp_path / "dense")
    with torch.no_grad():  # weights of a trained model's size, so fp16 noise stays small
        for p in hf.parameters():
            p.mul_(0.3)
    quantize_hf_model(hf, tmp_path, SCHEMES[name])
    check_engine_logprobs(tmp_path, hf)
    assert calls.get("fp8_gemv") and (calls.get("fp8_gemm") or calls.get("fp8_dequantize")), calls
