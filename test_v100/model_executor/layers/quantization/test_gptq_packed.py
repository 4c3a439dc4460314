"""GPTQ beyond 4-bit groups in order: activation order (g_idx), 8 bits, per-channel scales. The
linear layers at every kind of sharding against x W with W dequantized by an independent
quantizer, and whole models against transformers running the dequantized weights."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models import hf_compare
from test_v100.model_executor.models.hf_compare import TINY, load_ours, save_random_hf_model
from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                     RowParallelLinear)
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
from vllm_volta.model_executor.layers.quantization.packed_int import PackedIntConfig

from .int_checkpoints import Scheme, quantize, quantize_hf_model

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


def config_of(scheme: Scheme) -> PackedIntConfig:
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = scheme.config()
    return get_quant_config(cfg)


def load_layer(layer, scheme: Scheme, parts, gen, k: int) -> torch.Tensor:
    """Quantize random weights for each (shard id, outputs) of ``layer``, feed the checkpoint
    tensors to its loaders; returns the dequantized W [K, N] of the whole layer."""
    params = dict(layer.named_parameters())
    dense = []
    g_idx_order = None
    for shard, n in parts:
        # fused projections share their input, so GPTQ gives them one activation order
        seed = torch.Generator().manual_seed(7) if scheme.act_order else gen
        qt = quantize(torch.randn(n, k, generator=gen) * 0.1, scheme.bits, scheme.group, scheme.sym,
                      scheme.act_order, seed)
        if g_idx_order is not None:
            assert torch.equal(qt.g_idx, g_idx_order)
        g_idx_order = qt.g_idx
        for name, tensor in scheme.tensors(qt).items():
            if name in params:
                params[name].weight_loader(params[name], tensor, *(() if shard is None else (shard,)))
        dense.append(qt.dense.t())
    return torch.cat(dense, 1)


def test_configs_and_refusals():
    assert config_of(SCHEMES["act-order-4bit-v1"]).layout == "rows"
    assert config_of(SCHEMES["4bit-per-channel"]).layout == "awq"
    assert config_of(SCHEMES["8bit-v1"]).pack_factor == 4
    with pytest.raises(ValueError, match="bits: GPTQ with 3 bits is not supported"):
        config_of(Scheme("gptq", bits=3))
    with pytest.raises(ValueError, match="group_size must be a positive int or -1"):
        config_of(Scheme("gptq", group=-2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_linear_layers_compute_x_w(device, rows, name):
    """Merged gate/up, fused q/k/v (per shard) and a row-parallel layer with a bias."""
    scheme, gen = SCHEMES[name], torch.Generator().manual_seed(1)
    dtype = torch.float32 if device == "cpu" else torch.float16
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    x = torch.randn(rows, 128, generator=gen)
    with torch.device(device), quantization(config_of(scheme)):
        merged = MergedColumnParallelLinear(128, [64, 96], params_dtype=dtype)
        qkv = QKVParallelLinear(128, 16, 4, 2, bias=True, params_dtype=dtype)
        row = RowParallelLinear(128, 40, bias=True, params_dtype=dtype)
    for layer, parts in ((merged, [(0, 64), (1, 96)]), (qkv, [("q", 64), ("k", 32), ("v", 32)]), (row, [(None, 40)])):
        w = load_layer(layer, scheme, parts, gen, 128)
        bias = None
        if layer.bias is not None:
            bias = torch.randn(w.shape[1], generator=gen)
            layer.bias.data.copy_(bias)
        want = x.double() @ w + (0 if bias is None else bias.double())
        got = layer(x.to(device, dtype))
        assert got.shape == (rows, w.shape[1]) and got.dtype == dtype
        torch.testing.assert_close(got.double().cpu(), want, **tol)


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


@pytest.mark.parametrize("name", ["act-order-4bit-v1", "8bit-act-order-v2", "4bit-per-channel", "8bit-v1"])
def test_tp2_shards_reassemble(set_tp, name):
    """At tp_size 2: column-parallel ranks take their output columns; row-parallel ranks their
    input rows and g_idx entries (96 rows: rank boundaries cut groups of 32 in act order, whose
    scales every rank keeps) and the partial sums add up to x W."""
    scheme, hidden = SCHEMES[name], 64
    k_down = 96 if scheme.act_order or scheme.group == -1 else 128
    gen = torch.Generator().manual_seed(4)
    x, xi = torch.randn(3, hidden, generator=gen), torch.randn(3, k_down, generator=gen)
    sizes = {"q": 64, "k": 32, "v": 32}
    qts = {s: quantize(torch.randn(n, hidden, generator=gen) * 0.1, scheme.bits, scheme.group, scheme.sym,
                       scheme.act_order, torch.Generator().manual_seed(9)) for s, n in sizes.items()}
    down = quantize(torch.randn(hidden, k_down, generator=gen) * 0.1, scheme.bits, scheme.group, scheme.sym,
                    scheme.act_order, gen)
    outs, partial = [], []
    for rank in range(2):
        set_tp(rank, 2)
        with quantization(config_of(scheme)):
            qkv = QKVParallelLinear(hidden, 16, 4, 2)
            row = RowParallelLinear(k_down, hidden)
        for layer, items in ((qkv, [(s, qts[s]) for s in sizes]), (row, [(None, down)])):
            params = dict(layer.named_parameters())
            for shard, qt in items:
                for key, tensor in scheme.tensors(qt).items():
                    if key in params:
                        params[key].weight_loader(params[key], tensor, *(() if shard is None else (shard,)))
        outs.append(qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], -1))
        partial.append(row.matmul(xi[:, rank * k_down // 2:(rank + 1) * k_down // 2], None))
    for i, s in enumerate(sizes):
        got = torch.cat([outs[0][i], outs[1][i]], -1)
        torch.testing.assert_close(got.double(), x.double() @ qts[s].dense.t(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close((partial[0] + partial[1]).double(), xi.double() @ down.dense.t(), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=["act-order-4bit-v1", "8bit-act-order-v2", "4bit-per-channel"])
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_random_hf_model(transformers.Qwen2Config(**TINY), folder / "dense")  # q/k/v biases too
    quantize_hf_model(hf, folder, SCHEMES[request.param])
    return hf, load_ours(folder)


def test_model_keeps_packed_weights(models):
    _, ours = models
    params = dict(ours.named_parameters())
    assert params["model.layers.0.mlp.down_proj.qweight"].dtype == torch.int32
    assert not any(n.endswith("proj.weight") for n in params)
