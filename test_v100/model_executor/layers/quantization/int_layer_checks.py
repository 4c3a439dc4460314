"""Checks shared by the GPTQ and compressed-tensors tests: linear layers fed a ``Scheme``'s
checkpoint tensors (int_checkpoints.py) compute x W with W the dequantized weights, at tp 1 and
at tp 2 (each rank's slices rebuild the full layer)."""

from __future__ import annotations

import torch

from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                     RowParallelLinear)
from vllm_volta.model_executor.layers.quantization import quantization

from .int_checkpoints import Quantized, Scheme, config_of, quantize


def feed(layer: torch.nn.Module, scheme: Scheme, items: list[tuple[object, Quantized]]) -> None:
    """Each (shard id, quantized weight)'s checkpoint tensors through ``layer``'s loaders; every
    parameter of the layer must be fed."""
    params = dict(layer.named_parameters())
    fed = set()
    for shard, qt in items:
        for name, tensor in scheme.tensors(qt).items():
            if name in params:  # GPTQ stores g_idx even without activation order
                params[name].weight_loader(params[name], tensor, *(() if shard is None else (shard,)))
                fed.add(name)
    assert fed == set(params) - {"bias"}, set(params) - fed


def _quantize(scheme: Scheme, n: int, k: int, gen: torch.Generator) -> Quantized:
    # projections fused into one layer share their input, so GPTQ gives them one activation order
    order = torch.Generator().manual_seed(7)
    return quantize(torch.randn(n, k, generator=gen) * 0.1, scheme.bits, scheme.group, scheme.sym,
                    scheme.act_order, order)


def check_linear_layers(scheme: Scheme, device: str, rows: int) -> None:
    """Merged gate/up, fused q/k/v (per shard) and a row-parallel layer with a bias."""
    gen = torch.Generator().manual_seed(1)
    dtype = torch.float32 if device == "cpu" else torch.float16
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    x = torch.randn(rows, 128, generator=gen)
    with torch.device(device), quantization(config_of(scheme)):
        merged = MergedColumnParallelLinear(128, [64, 96], params_dtype=dtype)
        qkv = QKVParallelLinear(128, 16, 4, 2, bias=True, params_dtype=dtype)
        row = RowParallelLinear(128, 40, bias=True, params_dtype=dtype)
    for layer, parts in ((merged, [(0, 64), (1, 96)]), (qkv, [("q", 64), ("k", 32), ("v", 32)]), (row, [(None, 40)])):
        items = [(shard, _quantize(scheme, n, 128, gen)) for shard, n in parts]
        feed(layer, scheme, items)
        # 4-bit in activation order: rows sorted by group into AWQ's layout once loaded
        assert (getattr(layer, "quant_perm", None) is not None) == (scheme.act_order and scheme.bits == 4)
        w = torch.cat([qt.dense.t() for _, qt in items], 1)
        bias = None
        if layer.bias is not None:
            bias = torch.randn(w.shape[1], generator=gen)
            layer.bias.data.copy_(bias)
        want = x.double() @ w + (0 if bias is None else bias.double())
        got = layer(x.to(device, dtype))
        assert got.shape == (rows, w.shape[1]) and got.dtype == dtype
        torch.testing.assert_close(got.double().cpu(), want, **tol)


def check_tp2(set_tp, scheme: Scheme) -> None:
    """At tp_size 2: column-parallel ranks take their output columns; row-parallel ranks their
    input rows and g_idx entries (96 rows with act order or per channel: the rank boundary cuts
    groups, whose scales every rank keeps) and the partial sums add up to x W."""
    hidden = 64
    k_down = 96 if scheme.act_order or scheme.group == -1 else 128
    gen = torch.Generator().manual_seed(4)
    x, xi = torch.randn(3, hidden, generator=gen), torch.randn(3, k_down, generator=gen)
    sizes = {"q": 64, "k": 32, "v": 32}
    qts = {s: _quantize(scheme, n, hidden, gen) for s, n in sizes.items()}
    down = quantize(torch.randn(hidden, k_down, generator=gen) * 0.1, scheme.bits, scheme.group, scheme.sym,
                    scheme.act_order, gen)
    outs, partial = [], []
    for rank in range(2):
        set_tp(rank, 2)
        with quantization(config_of(scheme)):
            qkv = QKVParallelLinear(hidden, 16, 4, 2)
            row = RowParallelLinear(k_down, hidden)
        feed(qkv, scheme, list(qts.items()))
        feed(row, scheme, [(None, down)])
        sorted_rows = scheme.act_order and scheme.bits == 4
        # a row-parallel rank's rows hold uneven parts of groups: they stay dequantized by g_idx
        assert (getattr(qkv, "quant_perm", None) is not None, getattr(row, "quant_perm", None)) == (sorted_rows, None)
        outs.append(qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], -1))
        partial.append(row.matmul(xi[:, rank * k_down // 2:(rank + 1) * k_down // 2], None))
    for i, s in enumerate(sizes):
        got = torch.cat([outs[0][i], outs[1][i]], -1)
        torch.testing.assert_close(got.double(), x.double() @ qts[s].dense.t(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close((partial[0] + partial[1]).double(), xi.double() @ down.dense.t(),
                               atol=1e-4, rtol=1e-4)
