"""Pipeline stages: vLLM's layer split, VLLM_PP_LAYER_PARTITION, and a stage's model holding
(and loading) only its layers."""
from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models.hf_compare import TINY, load_ours, save_random_hf_model
from vllm_volta.model_executor.layers import parallel_state
from vllm_volta.model_executor.layers.pipeline_stage import PPMissingLayer, is_pp_missing
from vllm_volta.model_executor.layers.pp_partition import (PARTITION_ENV, even_partition, get_pp_indices,
                                                           stage_layer_counts)


@pytest.fixture
def stage(monkeypatch):
    """Make this process pipeline stage ``rank`` of ``size`` (model construction reads it)."""
    def set_stage(rank: int, size: int) -> None:
        monkeypatch.setattr(parallel_state, "_pp_rank", rank)
        monkeypatch.setattr(parallel_state, "_pp_size", size)
    return set_stage


@pytest.mark.parametrize("num_layers, pp_size, indices", [
    # vLLM's documented split (its uneven-partition test cases).
    (2, 2, [(0, 1), (1, 2)]),
    (3, 2, [(0, 2), (2, 3)]),
    (3, 3, [(0, 1), (1, 2), (2, 3)]),
    (4, 3, [(0, 1), (1, 3), (3, 4)]),
    (5, 3, [(0, 2), (2, 4), (4, 5)]),
    (10, 4, [(0, 2), (2, 5), (5, 8), (8, 10)]),
    (32, 4, [(0, 8), (8, 16), (16, 24), (24, 32)]),
    (5, 1, [(0, 5)]),
])
def test_default_split_gives_the_remainder_to_the_stages_before_the_last(monkeypatch, num_layers, pp_size,
                                                                         indices):
    monkeypatch.delenv(PARTITION_ENV, raising=False)
    assert [get_pp_indices(num_layers, r, pp_size) for r in range(pp_size)] == indices
    assert even_partition(num_layers, pp_size) == [end - start for start, end in indices]


def test_partition_variable(monkeypatch):
    monkeypatch.setenv(PARTITION_ENV, " 5, 3 ")
    assert stage_layer_counts(8, 2) == [5, 3]
    assert [get_pp_indices(8, r, 2) for r in range(2)] == [(0, 5), (5, 8)]
    assert get_pp_indices(8, 0, 1) == (0, 8)  # one stage: nothing to split


@pytest.mark.parametrize("text, match", [
    ("5;3", "comma list of layer counts"),
    ("a,b", "comma list of layer counts"),
    ("8", "gives 1 stage"),
    ("4,3,1", "needs exactly 2 counts"),
    ("8,0", "at least 1 layer"),
    ("4,3", "sums to 7 layers; the model has 8"),
])
def test_bad_partition_names_the_variable(monkeypatch, text, match):
    monkeypatch.setenv(PARTITION_ENV, text)
    with pytest.raises(ValueError, match=match) as e:
        stage_layer_counts(8, 2)
    assert PARTITION_ENV in str(e.value)


def test_more_stages_than_layers(monkeypatch):
    monkeypatch.delenv(PARTITION_ENV, raising=False)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=3 is more than the model's 2 .*\[1, 2\]"):
        get_pp_indices(2, 0, 3)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("pp_llama")
    config = transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 3})
    save_random_hf_model(config, path)
    return path


def _stage_params(model) -> set[str]:
    return {name.split(".weight")[0].split(".bias")[0] for name, _ in model.named_parameters()}


def test_stages_build_and_load_only_their_layers(llama_dir, stage, monkeypatch):
    """Default split of 3 layers on 2 stages: [0, 1] and [2]; embeddings on the first, final norm
    and LM head on the last. Loading the whole checkpoint fills exactly the stage's parameters
    (the loader fails on any it lacks) and skips the rest."""
    monkeypatch.delenv(PARTITION_ENV, raising=False)
    whole = load_ours(llama_dir)
    stage(0, 2)
    first = load_ours(llama_dir)
    stage(1, 2)
    last = load_ours(llama_dir)
    assert (first.model.pp.start, first.model.pp.end, last.model.pp.start, last.model.pp.end) == (0, 2, 2, 3)
    for model, held, missing in ((first, [0, 1], [2]), (last, [2], [0, 1])):
        for i in missing:
            assert isinstance(model.model.layers[i], PPMissingLayer)
            assert is_pp_missing(model, f"model.layers.{i}.mlp.down_proj.weight")
        for i in held:
            assert not is_pp_missing(model, f"model.layers.{i}.mlp.down_proj.weight")
            for (name, p), (_, q) in zip(model.model.layers[i].named_parameters(),
                                         whole.model.layers[i].named_parameters()):
                assert torch.equal(p, q), name
    assert not any(n.startswith(("model.norm", "lm_head")) for n in _stage_params(first))
    assert not any(n.startswith("model.embed_tokens") for n in _stage_params(last))
    assert torch.equal(first.model.embed_tokens.weight, whole.model.embed_tokens.weight)
    assert torch.equal(last.lm_head.weight, whole.lm_head.weight)


def test_tied_head_keeps_the_embeddings_on_the_last_stage(tmp_path, stage):
    config = transformers.LlamaConfig(**{**TINY, "tie_word_embeddings": True})
    hf = save_random_hf_model(config, tmp_path)
    stage(1, 2)
    last = load_ours(tmp_path)
    assert torch.equal(last.lm_head.weight, hf.lm_head.weight)
    assert isinstance(last.model.layers[0], PPMissingLayer)


def test_gemma4_refuses_pipeline_parallelism(stage):
    from test_v100.model_executor.models.test_gemma4 import text_config
    from vllm_volta.model_executor.models.gemma4 import Gemma4ForCausalLM
    stage(0, 2)
    with pytest.raises(ValueError, match="Gemma 4 does not support pipeline_parallel_size=2"):
        Gemma4ForCausalLM(text_config("dense"), dtype=torch.float32)
