"""get_model: load formats, dummy weights, checkpoint errors, GGUF end to end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from vllm_volta.model_executor.model_loader.loader import get_model, resolve_load_format
from vllm_volta.model_executor.models.llama import LlamaForCausalLM
from vllm_volta.transformers_utils.config import resolve_model_source

from ..models.hf_compare import TINY, PagedRunner, check_single_prefill, load_ours, save_random_hf_model


def _config(**overrides):
    config = transformers.LlamaConfig(**{**TINY, **overrides})
    config.architectures = ["LlamaForCausalLM"]
    return config


def _model_config(hf_config, path="unused", load_format="auto", dtype=torch.float32):
    return SimpleNamespace(model=str(path), hf_config=hf_config, dtype=dtype,
                           load_format=load_format, model_path=str(path), revision=None)


@pytest.mark.parametrize("given,path,expected", [
    ("auto", "/m/folder", "safetensors"), ("auto", "/m/x.gguf", "gguf"),
    ("gguf", "/m/x.gguf", "gguf"), ("safetensors", "/m/f", "safetensors"),
    ("dummy", "/m/x.gguf", "dummy"),
])
def test_resolve_load_format(given, path, expected):
    assert resolve_load_format(given, path) == expected


@pytest.mark.parametrize("given,path,match", [
    ("pt", "/m/f", "load_format must be one of auto, safetensors, gguf, dummy"),
    ("gguf", "/m/f", "needs a .gguf"), ("safetensors", "/m/x.gguf", "cannot read the GGUF"),
])
def test_resolve_load_format_errors(given, path, match):
    with pytest.raises(ValueError, match=match):
        resolve_load_format(given, path)


def test_dummy_weights_are_small_deterministic_and_run():
    mc = _model_config(_config(), load_format="dummy", dtype=torch.float16)
    model = get_model(mc, "cpu")  # backend from the platform
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert model.model.layers[0].self_attn.attn.backend_cls.name == "TORCH_SDPA"
    again = get_model(mc, "cpu")
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert p.dtype == torch.float16 and torch.equal(p, q), name
        if name.endswith("norm.weight"):
            assert torch.all(p == 1), name
        else:
            assert p.abs().max() <= 1e-3 and p.abs().max() > 0, name
    logits = PagedRunner(model).step({"x": [1, 2, 3, 4, 5]})["x"]
    assert logits.shape == (5, TINY["vocab_size"]) and torch.isfinite(logits).all()


def test_dummy_fp8_weights_fill_and_run():
    cfg = _config()
    cfg.quantization_config = {"quant_method": "fp8", "activation_scheme": "dynamic",
                               "weight_block_size": [16, 16]}
    model = get_model(_model_config(cfg, load_format="dummy", dtype=torch.float32), "cpu")
    fp8 = [p for p in model.parameters() if p.dtype == torch.float8_e4m3fn]
    assert fp8 and all(0 < p.float().abs().max() <= 1 for p in fp8)
    logits = PagedRunner(model).step({"x": [1, 2, 3, 4, 5]})["x"]
    assert torch.isfinite(logits).all()


@pytest.fixture
def checkpoint(tmp_path):
    save_random_hf_model(_config(), tmp_path)
    return tmp_path, load_file(tmp_path / "model.safetensors")


def _rewrite(folder, tensors):
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_missing_weight_is_an_error(checkpoint):
    folder, tensors = checkpoint
    del tensors["model.layers.1.self_attn.v_proj.weight"]  # the fused qkv stays incomplete
    _rewrite(folder, tensors)
    with pytest.raises(ValueError, match="lacks weights for: model.layers.1.self_attn.qkv_proj"):
        load_ours(folder)


def test_unexpected_weight_is_an_error(checkpoint):
    folder, tensors = checkpoint
    tensors["model.layers.0.extra.weight"] = torch.zeros(2)
    _rewrite(folder, tensors)
    with pytest.raises(ValueError, match="'model.layers.0.extra.weight' does not belong"):
        load_ours(folder)


def test_shape_mismatch_names_the_tensor(checkpoint):
    folder, tensors = checkpoint
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(5, TINY["hidden_size"])
    _rewrite(folder, tensors)
    with pytest.raises(ValueError, match="'model.layers.0.mlp.up_proj.weight'.*shape"):
        load_ours(folder)


def test_gguf_file_matches_transformers(tmp_path):
    """A GGUF file (written as llama.cpp does, q/k permuted) loads through load_format auto and
    gives transformers' logits."""
    from .test_gguf_synthetic import write_gguf

    config = _config(bos_token_id=1, eos_token_id=2, rope_theta=50000.0)
    hf = save_random_hf_model(config, tmp_path / "hf")
    path = write_gguf(tmp_path / "tiny.gguf", "llama", config, hf.state_dict())
    source = resolve_model_source(str(path))
    assert source.format == "gguf" and source.path == path
    model = get_model(_model_config(source.hf_config, path), "cpu")
    check_single_prefill(model, hf)
