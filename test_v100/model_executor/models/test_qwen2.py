"""Qwen2 (q/k/v bias) vs transformers on random weights, through the paged KV cache."""

from __future__ import annotations

import pytest
import torch
import transformers

from . import hf_compare
from .hf_compare import TINY, check_fp16_decode_fusions, load_ours, save_random_hf_model


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    config = transformers.Qwen2Config(**TINY, rope_theta=1000000.0, tie_word_embeddings=True)
    hf = save_random_hf_model(config, folder)
    return hf, load_ours(folder)


def test_qkv_bias_loaded(models):
    hf, ours = models
    attn = ours.model.layers[0].self_attn
    ref = hf.model.layers[0].self_attn
    assert attn.o_proj.bias is None
    expected = [ref.q_proj.bias, ref.k_proj.bias, ref.v_proj.bias]
    assert attn.qkv_proj.bias.tolist() == [x for b in expected for x in b.tolist()]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_decode_fusions_on_gpu(models, tmp_path, monkeypatch):
    check_fp16_decode_fusions(models[0], tmp_path, monkeypatch)
