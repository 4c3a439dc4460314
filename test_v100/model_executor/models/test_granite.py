"""Granite 3.x (Llama with embedding / attention / residual multipliers and logits scaling) vs
transformers."""

from __future__ import annotations

import pytest
import transformers

from . import hf_compare
from .hf_compare import TINY, hf_and_ours


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("granite")
    # Multipliers far from 1, so that each one matters.
    config = transformers.GraniteConfig(**TINY, pad_token_id=0, embedding_multiplier=6.0, residual_multiplier=0.3,
                                        attention_multiplier=0.05, logits_scaling=4.0)
    return hf_and_ours(config, folder)


def test_loaded_as_granite(models):
    hf, ours = models
    assert type(ours).__name__ == "GraniteForCausalLM"
    assert ours.model.embed_scale == 6.0 and ours.logits_processor.scale == 0.25
    assert ours.model.layers[0].self_attn.attn.impl.scale == 0.05

