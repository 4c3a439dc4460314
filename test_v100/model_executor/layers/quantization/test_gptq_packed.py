"""GPTQ beyond 4-bit groups in order: activation order (g_idx), 8 bits, per-channel scales. The
linear layers at every kind of sharding against x W with W dequantized by an independent
quantizer, and whole models against transformers running the dequantized weights."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models import hf_compare
from test_v100.model_executor.models.hf_compare import TINY, load_ours, save_random_hf_model
from vllm_volta.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization

from .int_checkpoints import Scheme, config_of, quantize, quantize_hf_model
from .int_layer_checks import check_linear_layers, check_tp2, feed

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]
SCHEMES = {
    "act-order-4bit-v1": Scheme("gptq", bits=4, group=16, act_order=True, fmt="gptq"),
    "act-order-4bit-sym-v2": Scheme("gptq", bits=4, group=32, sym=True, act_order=True, fmt="gptq_v2"),
    "8bit-v1": Scheme("gptq", bits=8, group=32, fmt="gptq"),
    "8bit-act-order-v2": Scheme("gptq", bits=8, group=16, act_order=True, fmt="gptq_v2"),
    "4bit-per-channel": Scheme("gptq", bits=4, group=-1, fmt="gptq"),
    "8bit-per-channel-sym": Scheme("gptq", bits=8, group=-1, sym=True, fmt="gptq"),
}

# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


def test_configs_and_refusals():
    assert config_of(SCHEMES["act-order-4bit-v1"]).layout == "rows"
    assert config_of(SCHEMES["4bit-per-channel"]).layout == "awq"
    assert config_of(SCHEMES["8bit-v1"]).pack_factor == 4
    with pytest.raises(ValueError, match="bits: GPTQ with 3 bits is not supported"):
        config_of(Scheme("gptq", bits=3))
    with pytest.raises(ValueError, match="group_size must be a positive int or -1"):
        config_of(Scheme("gptq", group=-2))
    cfg = transformers.LlamaConfig(**TINY)
    for key, value in (("lm_head", True), ("dynamic", {"-:.*down_proj": {}})):
        cfg.quantization_config = Scheme("gptq").config() | {key: value}
        with pytest.raises(ValueError, match=f"quantization_config.{key}: .* is not supported"):
            get_quant_config(cfg)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_linear_layers_compute_x_w(device, rows, name):
    check_linear_layers(SCHEMES[name], device, rows)


def test_fused_projections_must_share_the_activation_order():
    scheme = SCHEMES["act-order-4bit-v1"]
    with quantization(config_of(scheme)):
        merged = MergedColumnParallelLinear(64, [32, 32])
    params = dict(merged.named_parameters())
    for shard, seed in ((0, 1), (1, 2)):
        qt = quantize(torch.randn(32, 64), 4, 16, False, True, torch.Generator().manual_seed(seed))
        if shard == 1:
            with pytest.raises(ValueError, match="g_idx differs between the projections"):
                params["g_idx"].weight_loader(params["g_idx"], qt.g_idx, shard)
        else:
            params["g_idx"].weight_loader(params["g_idx"], qt.g_idx, shard)
    with pytest.raises(ValueError, match="outside 0..3"):
        params["g_idx"].weight_loader(params["g_idx"], torch.full((64,), 4, dtype=torch.int32), 0)


def test_act_order_with_a_short_last_group():
    """80 inputs in groups of 32 (GPTQ's last group has 16): not whole groups, so the layer stays
    dequantized by g_idx."""
    scheme, gen = Scheme("gptq", bits=4, group=32, act_order=True), torch.Generator().manual_seed(5)
    with quantization(config_of(scheme)):
        row = RowParallelLinear(80, 40)
    qt = quantize(torch.randn(40, 80, generator=gen) * 0.1, 4, 32, False, True, gen)
    assert qt.scales.shape[0] == 3
    feed(row, scheme, [(None, qt)])
    assert getattr(row, "quant_perm", None) is None
    x = torch.randn(5, 80, generator=gen)
    torch.testing.assert_close(row(x).double(), x.double() @ qt.dense.t(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["act-order-4bit-v1", "8bit-act-order-v2", "4bit-per-channel", "8bit-v1"])
def test_tp2_shards_reassemble(set_tp, name):
    check_tp2(set_tp, SCHEMES[name])


@pytest.fixture(scope="module", params=["act-order-4bit-v1", "8bit-act-order-v2", "4bit-per-channel"])
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_random_hf_model(transformers.Qwen2Config(**TINY), folder / "dense")  # q/k/v biases too
    quantize_hf_model(hf, folder, SCHEMES[request.param])
    return hf, load_ours(folder)


def test_model_keeps_packed_weights(models, request):
    _, ours = models
    params = dict(ours.named_parameters())
    assert params["model.layers.0.mlp.down_proj.qweight"].dtype == torch.int32
    assert not any(n.endswith("proj.weight") for n in params)
    scheme = SCHEMES[request.node.callspec.params["models"]]
    layer = ours.model.layers[1].self_attn.qkv_proj
    assert (getattr(layer, "quant_perm", None) is not None) == (scheme.act_order and scheme.bits == 4)
