"""The engine on a tiny quantized GGUF llama (Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K linear weights, fused
projections mixing types, one Q5_0 layer): on the CPU (dequantized at load) transformers' greedy
tokens of the dequantized weights; on a GPU in float16 the linear layers keep their blocks
(gguf_gemv at decode, gguf_dequantize + cuBLAS in prefill) and generate the greedy tokens of the
same engine with every weight dequantized at load."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import transformers

from test_v100.worker.tiny_models import hf_greedy, random_prompts
from vllm_volta.model_executor.layers.quantization import gguf as gguf_method
from vllm_volta.model_executor.model_loader import gguf_loader
from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config

from .gguf_checkpoints import write_tiny_llama

GREEDY_TOKENS = 8


def _generate(path: Path, **kwargs) -> tuple[list[list[int]], object]:
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    llm = LLM(str(path), skip_tokenizer_init=True, max_num_batched_tokens=16, **kwargs)
    prompts = random_prompts(3, 5, 40, seed=3)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], llm


def test_cpu_engine_matches_transformers(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf", scale=0.15)
    tokens, _ = _generate(path, dtype="float32", cpu_kvcache_space=0.01, quantization="gguf")
    hf = transformers.LlamaForCausalLM(load_gguf_config(path)).eval()
    hf.load_state_dict(dict(gguf_loader.iterate_gguf_weights(path, use_tqdm=False)))
    for prompt, got in zip(random_prompts(3, 5, 40, seed=3), tokens):
        assert got == hf_greedy(hf, prompt, GREEDY_TOKENS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not hasattr(torch.ops._C, "gguf_gemv"), reason="vllm_volta._C was built before gguf_gemv")
def test_gpu_blocks_match_dequantized_at_load(tmp_path, monkeypatch):
    path = write_tiny_llama(tmp_path / "tiny.gguf", scale=0.15)
    kept, llm = _generate(path, dtype="float16", gpu_memory_utilization=0.3)
    model = llm.llm_engine.executor.worker.model_runner.model
    layers = [m for m in model.modules() if hasattr(m, "gguf_parts")]
    assert len(layers) == 8 and sum(m.gguf_parts is not None for m in layers) == 7  # the Q5_0 down_proj: dense
    assert all(m.weight.dtype == torch.uint8 for m in layers if m.gguf_parts is not None)
    del llm, model, layers
    torch.cuda.empty_cache()
    # The same engine with everything dequantized at load (dense float16 layers).
    monkeypatch.setattr(gguf_method.GGUFConfig, "get_quant_method", lambda self: None)
    monkeypatch.setattr(gguf_loader, "iterate_gguf_weights",
                        functools.partial(gguf_loader.iterate_gguf_weights, keep_quantized=False))
    dense, _ = _generate(path, dtype="float16", gpu_memory_utilization=0.3)
    assert kept == dense
