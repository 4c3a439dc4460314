"""compressed-tensors W4A16 / W8A16 checkpoints ("pack-quantized"): the config and its refusals,
the linear layers at every kind of sharding against x W with W dequantized by an independent
quantizer, and whole models (one with a layer on the ignore list) against transformers running
the same weights dense."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from test_v100.model_executor.models import hf_compare
from test_v100.model_executor.models.hf_compare import TINY, load_ours, save_random_hf_model
from vllm_volta.config import ModelConfig
from vllm_volta.model_executor.layers.linear import MergedColumnParallelLinear
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization

from .int_checkpoints import Scheme, config_of, quantize, quantize_hf_model
from .int_layer_checks import check_linear_layers, check_tp2

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]
CT = "compressed-tensors"
SCHEMES = {
    "w4a16-group-asym": Scheme(CT, bits=4, group=32),
    "w4a16-group-sym": Scheme(CT, bits=4, group=16, sym=True),
    "w4a16-channel-sym": Scheme(CT, bits=4, group=-1, sym=True),
    "w4a16-actorder-sym": Scheme(CT, bits=4, group=32, sym=True, act_order=True),
    "w8a16-channel-sym": Scheme(CT, bits=8, group=-1, sym=True),
    "w8a16-group-asym": Scheme(CT, bits=8, group=32),
}
IGNORED = ("re:.*layers\\.1\\.mlp\\.down_proj", "model.layers.0.self_attn.o_proj")

# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


def test_config():
    assert config_of(SCHEMES["w4a16-group-asym"]).layout == "awq"
    assert config_of(SCHEMES["w4a16-actorder-sym"]).layout == "rows"
    w8 = config_of(SCHEMES["w8a16-channel-sym"])
    assert (w8.layout, w8.bits, w8.group_size, w8.has_zeros, w8.dense_ok) == ("rows", 8, -1, False, False)
    assert config_of(Scheme(CT, ignore=IGNORED)).dense_ok


def _refused(change, match: str) -> None:
    qc = Scheme(CT).config()
    change(qc)
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = qc
    with pytest.raises(ValueError, match=match):
        get_quant_config(cfg)


def _weights(qc):
    return qc["config_groups"]["group_0"]["weights"]


def test_refusals_name_the_field():
    int8_acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    _refused(lambda qc: qc["config_groups"]["group_0"].update(input_activations=int8_acts),
             r"config_groups.group_0.input_activations: activation quantization \(e.g. W8A8\)")
    _refused(lambda qc: _weights(qc).update(num_bits=3), r"weights.num_bits: 3 is not supported; supported: 4, 8")
    _refused(lambda qc: _weights(qc).update(type="float"), r"weights.type: 'float' is not supported")
    _refused(lambda qc: _weights(qc).update(strategy="tensor"), r"weights.strategy: 'tensor' is not supported")
    _refused(lambda qc: _weights(qc).update(group_size=None), r"weights.group_size: must be a positive int")
    _refused(lambda qc: qc.update(format="int-quantized"), r"quantization_config.format: 'int-quantized'")
    _refused(lambda qc: qc.update(kv_cache_scheme={"num_bits": 8}), r"kv_cache_scheme")
    _refused(lambda qc: qc.update(quantization_status="frozen"), r"quantization_status: 'frozen'")
    _refused(lambda qc: qc.update(ignore=["re:("]), r"ignore: 're:\(' is not a valid regex")

    def two_schemes(qc):
        qc["config_groups"]["group_1"] = copy.deepcopy(qc["config_groups"]["group_0"])
        _weights(qc).update(num_bits=8)
    _refused(two_schemes, r"config_groups: schemes with different weight arguments")


def test_quantization_flag_is_checked_against_the_checkpoint():
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = Scheme(CT).config()
    ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="compressed-tensors")
    with pytest.raises(ValueError, match="quantization='gptq', but the checkpoint is compressed-tensors-quantized"):
        ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="gptq")
    cfg.quantization_config = Scheme("gptq", bits=8).config()
    ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="gptq_marlin")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_linear_layers_compute_x_w(device, rows, name):
    check_linear_layers(SCHEMES[name], device, rows)


@pytest.mark.parametrize("name", ["w4a16-group-asym", "w4a16-actorder-sym", "w8a16-channel-sym"])
def test_tp2_shards_reassemble(set_tp, name):
    check_tp2(set_tp, SCHEMES[name])


def test_fused_layer_cannot_mix_dense_and_packed():
    """A layer of a checkpoint with an ignore list is dense or packed as its first tensor says."""
    scheme = Scheme(CT, ignore=IGNORED)
    with quantization(config_of(scheme)):
        merged = MergedColumnParallelLinear(64, [32, 32])
    params = dict(merged.named_parameters())
    assert "weight" in params and "weight_packed" in params
    qt = quantize(torch.randn(32, 64), 4, 32, False, False, torch.Generator().manual_seed(0))
    for name, tensor in scheme.tensors(qt).items():
        params[name].weight_loader(params[name], tensor, 0)
    assert "weight" not in dict(merged.named_parameters())
    with pytest.raises(ValueError, match="both packed and dense"):
        params["weight"].weight_loader(params["weight"], torch.randn(32, 64), 1)


@pytest.fixture(scope="module", params=["w4a16-group-asym-ignore", "w8a16-channel-sym", "w4a16-actorder-sym"])
def models(request, tmp_path_factory):
    name = request.param.removesuffix("-ignore")
    scheme = Scheme(**{**vars(SCHEMES[name]), "ignore": IGNORED if request.param.endswith("-ignore") else ()})
    folder = tmp_path_factory.mktemp(request.param)
    config = transformers.Qwen2Config(**TINY) if scheme.act_order else transformers.LlamaConfig(**TINY)
    hf = save_random_hf_model(config, folder / "dense")
    quantize_hf_model(hf, folder, scheme)
    return hf, load_ours(folder)


def test_model_keeps_packed_weights(models, request):
    """Every decoder linear layer holds its packed tensors but the ignored ones (dense)."""
    _, ours = models
    params = dict(ours.named_parameters())
    assert params["model.layers.0.mlp.down_proj.weight_packed"].dtype == torch.int32
    dense = {n for n in params if n.endswith("proj.weight")}
    ignored = request.node.callspec.params["models"].endswith("-ignore")
    assert dense == ({"model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight"}
                     if ignored else set())
