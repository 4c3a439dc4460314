"""Phi-3 / Phi-4 (fused qkv_proj and gate_up_proj in the checkpoint) vs transformers."""

from __future__ import annotations

import pytest
import transformers

from . import hf_compare
from .hf_compare import TINY, hf_and_ours, load_ours, save_random_hf_model


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module", params=[None, 5], ids=["full", "window5"])
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("phi3")
    config = transformers.Phi3Config(**TINY, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     sliding_window=request.param)  # Phi-3-mini-4k has a window
    return hf_and_ours(config, folder)


def test_loaded_as_phi3(models):
    hf, ours = models
    assert type(ours).__name__ == "Phi3ForCausalLM"
    assert ours.model.layers[0].self_attn.attn.impl.sliding_window == hf.config.sliding_window


def test_partial_rotary_is_refused(tmp_path):
    config = transformers.Phi3Config(**TINY, pad_token_id=0, partial_rotary_factor=0.75)
    save_random_hf_model(config, tmp_path)
    with pytest.raises(ValueError, match="partial_rotary_factor: 0.75 is not supported"):
        load_ours(tmp_path)
