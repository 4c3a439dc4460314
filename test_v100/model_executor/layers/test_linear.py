"""Linear layers: HF-style separate weights loaded through the shard-aware weight loaders."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.linear import (ColumnParallelLinear,
                                                     MergedColumnParallelLinear, QKVParallelLinear,
                                                     ReplicatedLinear, RowParallelLinear)


def _load(layer, name, *args):
    param = getattr(layer, name)
    param.weight_loader(param, *args)


def test_replicated_and_column():
    w, b, x = torch.randn(6, 5), torch.randn(6), torch.randn(3, 5)
    for cls in (ReplicatedLinear, ColumnParallelLinear):
        layer = cls(5, 6, bias=True)
        _load(layer, "weight", w)
        _load(layer, "bias", b)
        torch.testing.assert_close(layer(x), F.linear(x, w, b))


def test_qkv_matches_separate_projections():
    hidden, d, heads, kv = 16, 4, 4, 2
    wq, wk, wv = torch.randn(heads * d, hidden), torch.randn(kv * d, hidden), torch.randn(kv * d, hidden)
    bq, bk, bv = torch.randn(heads * d), torch.randn(kv * d), torch.randn(kv * d)
    layer = QKVParallelLinear(hidden, d, heads, kv, bias=True)
    for shard, w, b in (("v", wv, bv), ("q", wq, bq), ("k", wk, bk)):  # any order
        _load(layer, "weight", w, shard)
        _load(layer, "bias", b, shard)
    x = torch.randn(3, hidden)
    q, k, v = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], -1)
    torch.testing.assert_close(q, F.linear(x, wq, bq))
    torch.testing.assert_close(k, F.linear(x, wk, bk))
    torch.testing.assert_close(v, F.linear(x, wv, bv))
    fused = QKVParallelLinear(hidden, d, heads, kv)
    _load(fused, "weight", torch.cat([wq, wk, wv]))  # an already-fused checkpoint tensor
    torch.testing.assert_close(fused.weight, layer.weight)


def test_merged_column_matches_separate_projections():
    wg, wu, x = torch.randn(7, 5), torch.randn(7, 5), torch.randn(2, 5)
    layer = MergedColumnParallelLinear(5, [7, 7])
    _load(layer, "weight", wu, 1)
    _load(layer, "weight", wg, 0)
    torch.testing.assert_close(layer(x), torch.cat([F.linear(x, wg), F.linear(x, wu)], -1))
    with pytest.raises(ValueError, match="loaded_shard_id"):
        _load(layer, "weight", wg, 2)


def test_shape_mismatch_is_an_error():
    layer = RowParallelLinear(5, 6)
    with pytest.raises(ValueError, match=r"\(6, 4\).*size 5 in dimension 1"):
        _load(layer, "weight", torch.randn(6, 4))
    with pytest.raises(ValueError, match="size 6 in dimension 0"):
        _load(ColumnParallelLinear(5, 6), "weight", torch.randn(7, 5))
    with pytest.raises(ValueError, match=r"\(4, 5\)"):
        _load(ReplicatedLinear(5, 6), "weight", torch.randn(4, 5))


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_tp2_shards_reassemble(set_tp, kv_heads):
    """At tp_size 2 each rank holds its slice; the slices rebuild the full projections (kv heads
    fewer than ranks are replicated)."""
    hidden, d, heads = 8, 2, 4
    wq, wk, wv = (torch.randn(heads * d, hidden), torch.randn(kv_heads * d, hidden),
                  torch.randn(kv_heads * d, hidden))
    wg, wu, wd = torch.randn(6, hidden), torch.randn(6, hidden), torch.randn(hidden, 6)
    x, xi = torch.randn(3, hidden), torch.randn(3, 6)
    qs, ks, vs, gates, ups, downs = [], [], [], [], [], []
    for rank in range(2):
        set_tp(rank, 2)
        qkv = QKVParallelLinear(hidden, d, heads, kv_heads)
        for shard, w in (("q", wq), ("k", wk), ("v", wv)):
            _load(qkv, "weight", w, shard)
        q, k, v = qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], -1)
        qs.append(q), ks.append(k), vs.append(v)
        mlp = MergedColumnParallelLinear(hidden, [6, 6])
        _load(mlp, "weight", wg, 0)
        _load(mlp, "weight", wu, 1)
        g, u = mlp(x).chunk(2, -1)
        gates.append(g), ups.append(u)
        down = RowParallelLinear(6, hidden)
        _load(down, "weight", wd)
        downs.append(F.linear(xi[:, rank * 3:(rank + 1) * 3], down.weight))  # partial sum
    torch.testing.assert_close(torch.cat(qs, -1), F.linear(x, wq))
    if kv_heads == 1:
        for part in (ks, vs):
            torch.testing.assert_close(part[0], part[1])
        ks, vs = ks[:1], vs[:1]
    torch.testing.assert_close(torch.cat(ks, -1), F.linear(x, wk))
    torch.testing.assert_close(torch.cat(vs, -1), F.linear(x, wv))
    torch.testing.assert_close(torch.cat(gates, -1), F.linear(x, wg))
    torch.testing.assert_close(torch.cat(ups, -1), F.linear(x, wu))
    torch.testing.assert_close(downs[0] + downs[1], F.linear(xi, wd))
