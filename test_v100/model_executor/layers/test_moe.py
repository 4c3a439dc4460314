"""The MoE layer against a per-token loop written from the definition, alone and split over two
tensor-parallel ranks; bad configurations are clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.layers.quantization import quantization
from vllm_volta.model_executor.layers.quantization.awq import AWQConfig

E, K, H, I = 6, 2, 16, 24


def _weights(gen):
    return (torch.randn(E, H, generator=gen), torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen),
            torch.randn(E, H, I, generator=gen))


def _reference(x, router, gate, up, down, renormalize):
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t, row in enumerate(x.double()):
        probs = torch.softmax(router.double() @ row, 0)
        weights, ids = probs.topk(K)
        if renormalize:
            weights = weights / weights.sum()
        for w, e in zip(weights, ids):
            out[t] += w * (down[e].double() @ (F.silu(gate[e].double() @ row) * (up[e].double() @ row)))
    return out


def _load(moe, router, gate, up, down):
    moe.gate.weight.data.copy_(router)
    for e in range(E):
        moe.load_expert(e, "gate", gate[e])
        moe.load_expert(e, "up", up[e])
        moe.load_expert(e, "down", down[e])


@pytest.mark.parametrize("renormalize", [True, False])
def test_matches_the_definition(renormalize):
    gen = torch.Generator().manual_seed(0)
    router, gate, up, down = _weights(gen)
    moe = MoE(E, K, H, I, renormalize)
    _load(moe, router, gate, up, down)
    for tokens in (1, 5, 40):  # some experts get no token at small counts
        x = torch.randn(tokens, H, generator=gen)
        torch.testing.assert_close(moe(x).double(), _reference(x, router, gate, up, down, renormalize),
                                   atol=1e-4, rtol=1e-4)


def test_tp2_partial_outputs_sum_to_the_whole(set_tp, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    router, gate, up, down = _weights(gen)
    x = torch.randn(7, H, generator=gen)
    # The all-reduce is the sum of the ranks' outputs, taken here by hand.
    monkeypatch.setattr("vllm_volta.model_executor.layers.moe.tensor_model_parallel_all_reduce", lambda t: t)
    parts = []
    for rank in range(2):
        set_tp(rank, 2)
        moe = MoE(E, K, H, I, renormalize=True)
        assert moe.w13.shape == (E, I, H)  # half of each expert's intermediate size
        _load(moe, router, gate, up, down)
        parts.append(moe(x))
    torch.testing.assert_close((parts[0] + parts[1]).double(), _reference(x, router, gate, up, down, True),
                               atol=1e-4, rtol=1e-4)


def test_bad_configurations():
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in \[1, 6\]"):
        MoE(E, 7, H, I, True)
    # 4-bit experts need inputs in whole 32-value chunks (H = 16 is not)
    with quantization(AWQConfig(8)), pytest.raises(ValueError, match="group_size: the experts' hidden size"):
        MoE(E, K, H, I, True)
    moe = MoE(E, K, H, I, True)
    with pytest.raises(ValueError, match=r"expert index 6 is outside \[0, 6\)"):
        moe.load_expert(6, "gate", torch.zeros(I, H))
