"""FP8 checkpoints (fp8 block / per-tensor, compressed-tensors float tensor / channel / block): the
config and its refusals, linear layers against x W with W dequantized by an independent
quantizer (fp8_checkpoints.py), tensor-parallel shards, ignored layers, and whole models against
transformers running the same dequantized weights in float32. These run the weight-only path
(CPU); test_fp8_kernels.py covers the Triton W8A8 GEMM on an SM89+ GPU."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models import hf_compare
from test_v100.model_executor.models.hf_compare import TINY, load_ours, save_random_hf_model
from vllm_volta.config import ModelConfig
from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                     RowParallelLinear)
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
from vllm_volta.model_executor.layers.quantization.fp8 import fp8_kernel_path

from .checkpoints import check_engine_greedy
from .fp8_checkpoints import FP8, Fp8Scheme, config_of, quantize_hf_model

CT = "compressed-tensors"
SCHEMES = {
    "fp8-block": Fp8Scheme("fp8", "block", (32, 32)),
    "fp8-block-64-bf16": Fp8Scheme("fp8", "block", (64, 64), scale_dtype=torch.bfloat16),
    "fp8-tensor-static": Fp8Scheme("fp8", "tensor", acts="static"),
    "fp8-tensor-dynamic-bf16": Fp8Scheme("fp8", "tensor", scale_dtype=torch.bfloat16),
    "ct-channel": Fp8Scheme(CT, "channel", scale_dtype=torch.bfloat16),
    "ct-tensor-static": Fp8Scheme(CT, "tensor", acts="static"),
    "ct-block": Fp8Scheme(CT, "block", (64, 64)),
    "ct-w8a16-channel": Fp8Scheme(CT, "channel", acts=None),
}
IGNORED = ("re:.*layers\\.1\\.mlp\\.down_proj", "model.layers.0.self_attn.o_proj")

test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


def test_configs():
    block = config_of(SCHEMES["fp8-block"])
    assert (block.quant_method, block.strategy, block.block_shape, block.scale_name, block.act_quant) == \
        ("fp8", "block", (32, 32), "weight_scale_inv", "dynamic")
    tensor = config_of(SCHEMES["fp8-tensor-static"])
    assert (tensor.strategy, tensor.scale_name, tensor.act_quant) == ("tensor", "weight_scale", "static")
    ct = config_of(SCHEMES["ct-block"])
    assert (ct.quant_method, ct.strategy, ct.block_shape, ct.scale_name) == (CT, "block", (64, 64), "weight_scale")
    assert config_of(SCHEMES["ct-w8a16-channel"]).act_quant is None and not config_of(SCHEMES["ct-w8a16-channel"]).w8a8
    ignored = config_of(Fp8Scheme(ignore=IGNORED, ignore_key="modules_to_not_convert"))
    assert ignored.ignored == IGNORED and "2 ignore entries" in ignored.describe()
    assert "weight-only FP8: dequantized to float16 each call, then the CPU GEMM" in \
        fp8_kernel_path(block, torch.device("cpu"), torch.float16)
    assert "no activation quantization" in fp8_kernel_path(config_of(SCHEMES["ct-w8a16-channel"]),
                                                           torch.device("cuda"), torch.float16)
    assert "K blocks of 16 are not whole 32-wide FP8 GEMM tiles" in fp8_kernel_path(
        config_of(Fp8Scheme(block=(16, 16))), torch.device("cuda"), torch.float16)


def _refused(scheme: Fp8Scheme, change, match: str) -> None:
    qc = scheme.config()
    change(qc)
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = qc
    with pytest.raises(ValueError, match=match):
        get_quant_config(cfg)


def _ct_weights(qc):
    return qc["config_groups"]["group_0"]["weights"]


def test_refusals_name_the_field():
    fp8, ct = Fp8Scheme(), Fp8Scheme(CT, "channel")
    _refused(fp8, lambda qc: qc.update(activation_scheme="weird"), r"activation_scheme: 'weird' is not supported; "
             "supported: dynamic, static")
    _refused(fp8, lambda qc: qc.update(activation_scheme="static"), r"activation_scheme: block-wise FP8")
    _refused(fp8, lambda qc: qc.update(fmt="e5m2"), r"fmt: 'e5m2' is not supported; supported: e4m3")
    _refused(fp8, lambda qc: qc.update(weight_block_size=[128]), r"weight_block_size: must be two positive ints")
    _refused(fp8, lambda qc: qc.update(weight_block_size=[0, 128]), r"weight_block_size: must be two positive ints")
    _refused(fp8, lambda qc: qc.update(ignored_layers="lm_head"), r"ignored_layers: must be a list")
    _refused(fp8, lambda qc: qc.update(modules_to_not_convert=["re:("]), r"modules_to_not_convert: 're:\(' is not")
    _refused(ct, lambda qc: _ct_weights(qc).update(strategy="group"), r"weights.strategy: 'group' is not supported; "
             "supported: tensor, channel, block")
    _refused(ct, lambda qc: _ct_weights(qc).update(strategy="block"), r"block_structure: must be two positive ints")
    _refused(ct, lambda qc: _ct_weights(qc).update(symmetric=False), r"weights: FP8 weights must be symmetric")
    # float weights in another format: compressed_tensors.py's refusal
    _refused(Fp8Scheme(CT, "channel", acts=None), lambda qc: qc.update(format="pack-quantized"),
             r"weights.type: 'float' is not supported")
    _refused(ct, lambda qc: qc["config_groups"].update(
        group_1={**qc["config_groups"]["group_0"], "format": "int-quantized"}),
        r"group_1.format: 'int-quantized' is not supported for FP8")
    _refused(ct, lambda qc: qc.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), r"kv_cache_scheme")
    _refused(ct, lambda qc: qc["config_groups"]["group_0"].update(
        input_activations={"num_bits": 8, "type": "int", "dynamic": True}), r"input_activations: type 'int'")
    _refused(ct, lambda qc: qc["config_groups"].update(
        group_1={"targets": ["re:.*down"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}),
        r"group_1.weights: type 'int' / num_bits 4: only FP8")
    _refused(ct, lambda qc: qc.update(ignore=["re:["]), r"ignore: 're:\[' is not a valid regex")


def test_quantization_flag_accepts_fp8():
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = Fp8Scheme().config()
    ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="fp8")
    with pytest.raises(ValueError, match="quantization='awq', but the checkpoint is fp8-quantized"):
        ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="awq")
    cfg.quantization_config = Fp8Scheme(CT, "channel").config()
    ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="compressed-tensors")
    with pytest.raises(ValueError, match="checkpoint is compressed-tensors-quantized"):
        ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="fp8")
    with pytest.raises(ValueError, match="fp8"):  # the allowed values list it
        ModelConfig(model="tiny", hf_config=cfg, dtype="float32", quantization="fp4")


def _feed(layer, scheme: Fp8Scheme, items) -> None:
    """Each (shard id, weight [n, K] float)'s checkpoint tensors through ``layer``'s loaders;
    returns the dequantized weights [N, K] (float64) the layer must compute with."""
    params = dict(layer.named_parameters())
    dense = []
    for shard, w in items:
        qt = scheme.quantize(w)
        for name, tensor in scheme.tensors(qt, 0.02 + 0.01 * len(dense)).items():
            params[name].weight_loader(params[name], tensor, *(() if shard is None else (shard,)))
        dense.append(qt.dense)
    return torch.cat(dense)


DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_linear_layers_compute_x_w(device, rows, name, monkeypatch):
    """Merged gate/up, fused q/k/v (k and v cut blocks of 64 rows) and a row-parallel layer with a
    bias and K = 96 (a partial block of 64); one byte per weight. On a GPU this is the weight-only
    path (VLLM_VOLTA_DEVICE_CAPABILITY=7.0, as a V100 runs it)."""
    monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    scheme = SCHEMES[name]
    gen = torch.Generator().manual_seed(1)
    dtype = torch.float32 if device == "cpu" else torch.float16
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    with torch.device(device), quantization(config_of(scheme)):
        merged = MergedColumnParallelLinear(128, [64, 96], params_dtype=dtype)
        qkv = QKVParallelLinear(128, 16, 4, 2, bias=True, params_dtype=dtype)
        row = RowParallelLinear(96, 40, bias=True, params_dtype=dtype)
    for layer, parts in ((merged, [(0, 64), (1, 96)]), (qkv, [("q", 64), ("k", 32), ("v", 32)]), (row, [(None, 40)])):
        k = layer.input_size
        w = _feed(layer, scheme, [(shard, torch.randn(n, k, generator=gen) * 0.1) for shard, n in parts])
        assert layer.weight.dtype == FP8 and layer.weight.element_size() == 1 and layer.weight.device.type == device
        bias = None
        if layer.bias is not None:
            bias = torch.randn(w.shape[0], generator=gen)
            layer.bias.data.copy_(bias)
        x = torch.randn(rows, k, generator=gen)
        want = x.double() @ w.t() + (0 if bias is None else bias.double())
        got = layer(x.to(device, dtype))
        assert got.shape == (rows, w.shape[0]) and got.dtype == dtype
        torch.testing.assert_close(got.double().cpu(), want, **tol)


@pytest.mark.parametrize("name", ["fp8-block", "fp8-block-64-bf16", "ct-channel", "fp8-tensor-static"])
def test_tp2_shards_reassemble(set_tp, name):
    """At tp_size 2: q/k/v ranks take their heads (the 64-row blocks of k and v are cut in half:
    each rank keeps its rows' scales) and row-parallel ranks their half of K = 128 (whole blocks);
    outputs / partial sums add up to x W."""
    scheme = SCHEMES[name]
    gen = torch.Generator().manual_seed(4)
    hidden, k_down = 64, 128
    x, xi = torch.randn(3, hidden, generator=gen), torch.randn(3, k_down, generator=gen)
    weights = {s: torch.randn(n, hidden, generator=gen) * 0.1 for s, n in (("q", 64), ("k", 32), ("v", 32))}
    w_down = torch.randn(hidden, k_down, generator=gen) * 0.1
    outs, partial, dense = [], [], {}
    for rank in range(2):
        set_tp(rank, 2)
        with quantization(config_of(scheme)):
            qkv = QKVParallelLinear(hidden, 16, 4, 2)
            row = RowParallelLinear(k_down, hidden)
        for s, w in weights.items():
            dense[s] = _feed(qkv, scheme, [(s, w)])
        dense["down"] = _feed(row, scheme, [(None, w_down)])
        outs.append(qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], -1))
        partial.append(row.matmul(xi[:, rank * k_down // 2:(rank + 1) * k_down // 2], None))
    for i, s in enumerate(weights):
        got = torch.cat([outs[0][i], outs[1][i]], -1)
        torch.testing.assert_close(got.double(), x.double() @ dense[s].t(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close((partial[0] + partial[1]).double(), xi.double() @ dense["down"].t(),
                               atol=1e-4, rtol=1e-4)


def test_row_parallel_rank_inside_a_block_is_refused(set_tp):
    set_tp(0, 2)
    with quantization(config_of(SCHEMES["fp8-block-64-bf16"])):
        with pytest.raises(ValueError, match=r"each rank 48, which is not a whole number of 64-wide blocks.*"
                                             r"tensor parallel size that divides 2"):
            RowParallelLinear(96, 64)
        RowParallelLinear(128, 64)  # 64 inputs a rank: whole blocks


def test_bad_checkpoint_tensors_name_the_problem():
    scheme = SCHEMES["fp8-block"]
    with quantization(config_of(scheme)):
        layer = MergedColumnParallelLinear(64, [64, 64])
    with pytest.raises(ValueError, match=r"weight_scale_inv has shape \(3, 2\), expected \[2, ceil\(K / 32\)\]"):
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, torch.ones(3, 2), 0)
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        layer.weight.weight_loader(layer.weight, torch.zeros(64, 64, dtype=torch.float8_e5m2), 0)


def test_fused_layer_cannot_mix_dense_and_fp8():
    """A layer is FP8 or float as its first checkpoint tensor says; fused projections must agree."""
    scheme = SCHEMES["fp8-block"]
    with quantization(config_of(scheme)):
        merged = MergedColumnParallelLinear(64, [32, 32])
    params = dict(merged.named_parameters())
    qt = scheme.quantize(torch.randn(32, 64))
    params["weight"].weight_loader(params["weight"], qt.q, 0)
    with pytest.raises(ValueError, match="both fp8 and dense"):
        params["weight"].weight_loader(params["weight"], torch.randn(32, 64), 1)
    with quantization(config_of(scheme)):
        dense = MergedColumnParallelLinear(64, [32, 32])
    params = dict(dense.named_parameters())
    w = torch.randn(64, 64)
    params["weight"].weight_loader(params["weight"], w[:32].bfloat16(), 0)
    params["weight"].weight_loader(params["weight"], w[32:].bfloat16(), 1)
    assert set(dict(dense.named_parameters())) == {"weight"} and dense.weight.dtype == torch.float32
    x = torch.randn(2, 64)
    torch.testing.assert_close(dense(x), x @ w.bfloat16().float().t())
    with pytest.raises(ValueError, match="both dense and fp8"):
        params["weight_scale_inv"].weight_loader(params["weight_scale_inv"], qt.scale, 0)


@pytest.fixture(scope="module", params=["fp8-block-ignore", "fp8-block-64-bf16", "fp8-tensor-static",
                                        "ct-channel-ignore", "ct-block", "ct-w8a16-channel", "qwen3-fp8-block"])
def models(request, tmp_path_factory):
    name = request.param.removesuffix("-ignore").removeprefix("qwen3-")
    scheme = Fp8Scheme(**{**vars(SCHEMES[name]), "ignore": IGNORED if request.param.endswith("-ignore") else ()})
    folder = tmp_path_factory.mktemp(request.param)
    config = (transformers.Qwen3Config(**TINY, head_dim=16) if request.param.startswith("qwen3")
              else transformers.LlamaConfig(**TINY))
    hf = save_random_hf_model(config, folder / "dense")
    quantize_hf_model(hf, folder, scheme)
    return hf, load_ours(folder)


def test_model_keeps_fp8_weights(models, request):
    """Every decoder linear layer holds FP8 weights (one byte each) but the ignored ones (float)."""
    _, ours = models
    params = dict(ours.named_parameters())
    fp8 = {n for n, p in params.items() if p.dtype == FP8}
    proj = {n for n in params if n.endswith("proj.weight")}
    ignored = request.node.callspec.params["models"].endswith("-ignore")
    dense = {"model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight"} if ignored else set()
    assert fp8 == proj - dense
    assert all(params[n].dtype == torch.float32 for n in dense)
    assert not any(n.startswith(d + "_scale") or n == d.removesuffix("weight") + "input_scale"
                   for d in dense for n in params)  # ignored layers: no scales left


def test_static_input_scale_is_the_fused_maximum():
    """A fused layer keeps one input_scale: the largest of its projections' (they share the input)."""
    scheme = SCHEMES["fp8-tensor-static"]
    with quantization(config_of(scheme)):
        qkv = QKVParallelLinear(64, 16, 4, 2)
    gen = torch.Generator().manual_seed(0)
    for i, shard in enumerate("qkv"):
        qt = scheme.quantize(torch.randn(64 if shard == "q" else 32, 64, generator=gen))
        for name, tensor in scheme.tensors(qt, [0.03, 0.07, 0.05][i]).items():
            getattr(qkv, name).weight_loader(getattr(qkv, name), tensor, shard)
    assert qkv.input_scale.item() == pytest.approx(0.07)


def test_load_log_names_the_path(tmp_path, caplog):
    """The load log says which path the FP8 layers take and why (here: the CPU)."""
    import logging

    from vllm_volta.logger import ROOT_LOGGER_NAME, reset_log_once

    reset_log_once()
    root = logging.getLogger(ROOT_LOGGER_NAME)
    root.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger=ROOT_LOGGER_NAME)
    try:
        hf = save_random_hf_model(transformers.LlamaConfig(**TINY), tmp_path / "dense")
        quantize_hf_model(hf, tmp_path, SCHEMES["fp8-block"])
        load_ours(tmp_path)
    finally:
        root.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "FP8 linear layers" in r.getMessage()]
    assert len(lines) == 1
    assert "block 32x32" in lines[0] and "weight-only FP8: dequantized to float32 each call" in lines[0]
    assert "needs a CUDA GPU (here cpu)" in lines[0]


@pytest.mark.parametrize("name", ["fp8-block", "ct-channel"])
def test_engine_greedy_matches_transformers(tmp_path, name):
    """The engine (float32 on the CPU, chunked prefill next to decodes, --quantization checked)
    generates transformers' greedy tokens of the dequantized weights."""
    scheme = Fp8Scheme(**{**vars(SCHEMES[name]), "ignore": ("model.layers.1.mlp.down_proj",)})
    hf = save_random_hf_model(transformers.LlamaConfig(**{**TINY, "vocab_size": 384}), tmp_path / "dense")
    quantize_hf_model(hf, tmp_path, scheme)
    check_engine_greedy(tmp_path, hf, scheme.method)
