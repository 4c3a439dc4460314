"""Gemma (GeGLU, 1 + weight norms, scaled embeddings, tied head) vs transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from . import hf_compare
from .hf_compare import TINY, check_fp16_engine_logprobs, hf_and_ours


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    # head_dim 32 with 4 heads: q width 128 against hidden 64, as Gemma's heads of 256 against 2048.
    config = transformers.GemmaConfig(**TINY, head_dim=32)
    return hf_and_ours(config, folder)


def test_loaded_as_gemma(models):
    hf, ours = models
    assert type(ours).__name__ == "GemmaForCausalLM"
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert ours.model.embed_scale == 8.0  # sqrt(64)
    # The checkpoint's norm offsets get their 1 at load.
    hf_norm = hf.model.layers[0].input_layernorm.weight
    torch.testing.assert_close(ours.model.layers[0].input_layernorm.weight, hf_norm + 1)
    torch.testing.assert_close(ours.model.norm.weight, hf.model.norm.weight + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_engine_logprobs_match_transformers(tmp_path):
    check_fp16_engine_logprobs(tmp_path, "gemma")
