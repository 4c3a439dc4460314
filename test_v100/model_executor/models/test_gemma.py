"""Gemma (GeGLU, 1 + weight norms, scaled embeddings, tied head) vs transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from .hf_compare import TINY, check_mixed_batch, check_single_prefill, load_ours, save_random_hf_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    # head_dim 32 with 4 heads: q width 128 against hidden 64, as Gemma's heads of 256 against 2048.
    config = transformers.GemmaConfig(**TINY, head_dim=32)
    hf = save_random_hf_model(config, folder)
    return hf, load_ours(folder)


def test_loaded_as_gemma(models):
    hf, ours = models
    assert type(ours).__name__ == "GemmaForCausalLM"
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert ours.model.embed_scale == 8.0  # sqrt(64)
    # The checkpoint's norm offsets get their 1 at load.
    hf_norm = hf.model.layers[0].input_layernorm.weight
    torch.testing.assert_close(ours.model.layers[0].input_layernorm.weight, hf_norm + 1)
    torch.testing.assert_close(ours.model.norm.weight, hf.model.norm.weight + 1)


def test_single_prefill_matches_transformers(models):
    check_single_prefill(models[1], models[0])


def test_mixed_batch_matches_transformers(models):
    check_mixed_batch(models[1], models[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_engine_logprobs_match_transformers(tmp_path):
    """The engine as users run it (fp16, the CUDA backend with heads of 256 as in Gemma, CUDA
    graphs): every prompt and generated token's logprob is within fp16 noise of transformers'
    (fp32) on the same sequence, so the check does not depend on which token a near-tie picks."""
    from test_v100.worker.tiny_models import random_prompts, save_tiny_model
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    hf = save_tiny_model(tmp_path, "gemma", hidden_size=256, intermediate_size=512,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float16", gpu_memory_utilization=0.3,
              max_num_seqs=8)
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.attn_backend.name == "VOLTA_PAGED" and runner.graph_runner is not None
    prompts = random_prompts(4, 5, 60, seed=7)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0, prompt_logprobs=0)
    outs = llm.generate(prompts, params, use_tqdm=False)
    hf = hf.cuda()
    for prompt, out in zip(prompts, outs):
        gen = list(out.outputs[0].token_ids)
        seq = prompt + gen
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([seq], device="cuda")).logits[0].float(), -1)
        want = [ref[i - 1, seq[i]].item() for i in range(1, len(seq))]
        got = [out.prompt_logprobs[i][seq[i]].logprob for i in range(1, len(prompt))]
        got += [step[tok].logprob for step, tok in zip(out.outputs[0].logprobs, gen)]
        assert len(got) == len(want)
        assert max(abs(a - b) for a, b in zip(got, want)) < 0.1
