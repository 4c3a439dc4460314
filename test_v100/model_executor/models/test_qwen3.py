"""Qwen3 (per-head q/k RMSNorm, explicit head_dim) vs transformers, through the paged KV cache."""

from __future__ import annotations

import pytest
import transformers

from . import hf_compare
from .hf_compare import TINY, load_ours, save_random_hf_model


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3")
    # head_dim 32 with 4 heads: q/k/v width (128) differs from hidden_size (64), as in Qwen3.
    config = transformers.Qwen3Config(**TINY, head_dim=32, rope_theta=1000000.0)
    hf = save_random_hf_model(config, folder)
    return hf, load_ours(folder)


def test_qk_norm_loaded(models):
    hf, ours = models
    attn = ours.model.layers[1].self_attn
    assert attn.q_norm.weight.tolist() == hf.model.layers[1].self_attn.q_norm.weight.tolist()
    assert attn.k_norm.weight.tolist() == hf.model.layers[1].self_attn.k_norm.weight.tolist()

