"""AWQ checkpoints whose ``modules_to_not_convert`` keeps some linear layers float: each layer is
dense or packed as the checkpoint's tensors say, and a whole model gives the greedy tokens of the
same weights run dense by transformers."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from test_v100.model_executor.models.hf_compare import TINY, save_random_hf_model
from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                     RowParallelLinear)
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
from vllm_volta.model_executor.layers.quantization.awq import AWQConfig, AWQLinearMethod
from vllm_volta.model_executor.layers.quantization.dense_or_packed import AWQDenseOrPackedMethod

from .checkpoints import check_engine_greedy, pack, quantize_hf_model, random_quantized

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]
AWQ_QC = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}


def _config(**extra) -> AWQConfig:
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = AWQ_QC | extra
    return get_quant_config(cfg)


def test_config_accepts_a_list_of_names():
    """No list (or null / empty) keeps the plain AWQ method; a list makes layers dense-or-packed."""
    for extra in ({}, {"modules_to_not_convert": None}, {"modules_to_not_convert": []}):
        config = _config(**extra)
        assert config == AWQConfig(32) and type(config.get_quant_method()) is AWQLinearMethod
    config = _config(modules_to_not_convert=["visual", "mlp.gate"])
    assert config.modules_to_not_convert == ("visual", "mlp.gate")
    assert isinstance(config.get_quant_method(), AWQDenseOrPackedMethod)
    assert "modules_to_not_convert: visual, mlp.gate" in config.describe()


@pytest.mark.parametrize("bad", ["visual", [1], {"visual": True}, ["visual", None]])
def test_bad_modules_to_not_convert_names_the_field(bad):
    with pytest.raises(ValueError, match=r"quantization_config\.modules_to_not_convert must be a list of "
                                         r"module names \(strings\) or null"):
        _config(modules_to_not_convert=bad)


def _load(layer, name, tensor, *shard):
    param = dict(layer.named_parameters())[name]
    param.weight_loader(param, tensor, *shard)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layers_follow_their_checkpoint_tensors(device, dtype):
    """Under a list, q/k/v loaded dense and a row-parallel layer loaded dense compute x W^T with
    their float weights (never repacked); gate/up loaded packed computes x W from its 4-bit
    tensors (repacked for the W4A16 kernels where they serve it)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 128, generator=gen)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    with torch.device(device), quantization(AWQConfig(32, modules_to_not_convert=("self_attn",))):
        qkv = QKVParallelLinear(128, 16, 4, 2, params_dtype=dtype)
        row = RowParallelLinear(128, 40, bias=True, params_dtype=dtype)
        merged = MergedColumnParallelLinear(128, [64, 96], params_dtype=dtype)

    dense = {s: torch.randn(n, 128, generator=gen) * 0.1 for s, n in (("q", 64), ("k", 32), ("v", 32))}
    for shard, w in dense.items():
        _load(qkv, "weight", w, shard)
    w_row = torch.randn(40, 128, generator=gen) * 0.1
    _load(row, "weight", w_row)
    bias = torch.randn(40, generator=gen)
    row.bias.data.copy_(bias)
    packed = []
    for shard, n in ((0, 64), (1, 96)):
        q, z, s, w = random_quantized(128, n, 32, gen)
        for name, t in (("qweight", pack(q)), ("qzeros", pack(z)), ("scales", s)):
            _load(merged, name, t, shard)
        packed.append(w)

    for layer in (qkv, row):
        names = {n for n, _ in layer.named_parameters()}
        assert layer.quant_kind == "dense" and not names & {"qweight", "qzeros", "scales"}
        assert "w4_weights" not in layer.__dict__ and "w4_loaded" not in layer.__dict__
    assert merged.quant_kind == "packed" and "weight" not in dict(merged.named_parameters())
    from vllm_volta.model_executor.layers.quantization import w4_linear
    repacks = w4_linear.kernels_available(torch.device(device), dtype)
    assert ("w4_weights" in merged.__dict__) == repacks

    xd = x.to(device, dtype)
    w_qkv = torch.cat(list(dense.values()))
    torch.testing.assert_close(qkv(xd).double().cpu(), x.double() @ w_qkv.double().t(), **tol)
    torch.testing.assert_close(row(xd).double().cpu(), x.double() @ w_row.double().t() + bias.double(), **tol)
    torch.testing.assert_close(merged(xd).double().cpu(), x.double() @ torch.cat(packed, 1), **tol)


def test_fused_layer_cannot_mix_dense_and_packed():
    with quantization(AWQConfig(32, modules_to_not_convert=("mlp",))):
        merged = MergedColumnParallelLinear(64, [32, 32])
    params = dict(merged.named_parameters())  # as the model loader sees them before loading
    weight, scales = params["weight"], params["scales"]
    weight.weight_loader(weight, torch.randn(32, 64), 0)
    assert "scales" not in dict(merged.named_parameters())
    with pytest.raises(ValueError, match="both dense and packed"):
        scales.weight_loader(scales, torch.ones(2, 32, dtype=torch.float16), 1)
    assert weight.numel() == 0  # the placeholder was replaced by the full float weight
    assert merged.weight.shape == (64, 64)


def test_engine_greedy_with_dense_down_proj(tmp_path):
    """A tiny AWQ Llama whose down_proj layers stay float (listed in modules_to_not_convert, held
    as float weights off the 4-bit grid) generates transformers' greedy tokens of the same
    weights (the packed layers' dequantized values, the dense ones as stored)."""
    hf = save_random_hf_model(transformers.LlamaConfig(**{**TINY, "vocab_size": 384}), tmp_path / "dense")
    quantize_hf_model(hf, tmp_path, group=32)
    gen = torch.Generator().manual_seed(3)
    tensors = load_file(tmp_path / "model.safetensors")
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            proj = layer.mlp.down_proj
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) * 0.05)
            prefix = f"model.layers.{i}.mlp.down_proj"
            for key in ("qweight", "qzeros", "scales"):
                del tensors[f"{prefix}.{key}"]
            tensors[f"{prefix}.weight"] = proj.weight.detach().clone()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["down_proj"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_engine_greedy(tmp_path, hf, "awq")
