"""The GPU paths' bookkeeping of quantized experts (fused_moe_quant.py), on CPU: the CUDA ops they
call are replaced by plain-PyTorch versions of their documented contracts, so what is checked is
the glue: pair ids of the gathered experts, the chunks' id maps and their sum, expert
parallelism's masked pairs. Every path must give the dequantized MoE's output."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from test_v100.model_executor.layers.quantization.test_moe_quant import E, H, TOP_K, _build, _checkpoint, _reference
from vllm_volta.model_executor.layers import fused_moe, fused_moe_quant
from vllm_volta.model_executor.layers.expert_parallel import expert_parallel
from vllm_volta.model_executor.layers.quantization import moe_w4_layout as w4


def _act(v: torch.Tensor, activation) -> torch.Tensor:
    return F.silu(v) if activation in ("silu", 0) else F.gelu(v, approximate="tanh")


def _fake_fused_experts(x, w13, w2, weights, ids, config, activation="silu", expert_map=None):
    """fused_experts' contract: sum_j weights[t, j] * expert ids[t, j]'s MLP, ids mapped through
    expert_map (pairs mapped to -1 add nothing)."""
    if expert_map is not None:
        ids = expert_map[ids.long()]
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            gu = w13[e].double() @ x[t].double()
            out[t] += float(weights[t, j]) * (w2[e].double() @ (_act(gu[:inter], activation) * gu[inter:]))
    return out.to(x.dtype)


class _FakeOps:
    """The 4-bit ops' contracts in PyTorch (float32 here)."""

    @staticmethod
    def moe_w4_gemv_act_and_mul(out, x, qweight, sz, ids, activation):
        inter = out.shape[2]
        for t in range(ids.shape[0]):
            for j in range(ids.shape[1]):
                gu = w4.dequantize(qweight[int(ids[t, j])], sz[int(ids[t, j])], torch.float32) @ x[t]
                out[t, j] = _act(gu[:inter], activation) * gu[inter:]

    @staticmethod
    def moe_w4_gemv_down_sum(out, act, qweight, sz, ids, weights):
        out.zero_()
        for t in range(ids.shape[0]):
            for j in range(ids.shape[1]):
                out[t] += weights[t, j] * (w4.dequantize(qweight[int(ids[t, j])], sz[int(ids[t, j])],
                                                         torch.float32) @ act[t, j])

    @staticmethod
    def moe_w4_dequantize(out, qweight, sz, experts):
        out.copy_(w4.dequantize(qweight[experts.long()], sz[experts.long()], out.dtype))


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(fused_moe_quant, "ops", _FakeOps)
    monkeypatch.setattr(fused_moe, "fused_experts", _fake_fused_experts)
    monkeypatch.setattr(fused_moe_quant, "CHUNK_BYTES", 4 * 3 * H * H * 2)  # 4 experts a chunk: two chunks of 6


def _run(moe, x):
    ids, weights = moe.route(x)
    return fused_moe_quant.quantized_experts(moe, x, ids, weights)


@pytest.mark.parametrize("kind,fmt", [("w4", "awq"), ("fp8", "block")])
@pytest.mark.parametrize("tokens", [1, 3, 24, 30])  # 6 experts, top 2: w4 GEMVs up to 48 pairs; FP8 gathered
# up to 6 pairs (and 4 experts' scratch here); chunks above
def test_every_path_gives_the_moe(fake_gpu, kind, fmt, tokens):
    config, router, tensors, dense = _checkpoint(kind, fmt)
    moe = _build(config, router, tensors)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens))
    torch.testing.assert_close(_run(moe, x).double(), _reference(x, router, dense), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens", [1, 12, 30])
def test_expert_parallel_pairs_add_nothing_elsewhere(fake_gpu, set_tp, tokens):
    config, router, tensors, dense = _checkpoint("w4", "awq", seed=4)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(1))
    total = 0
    for rank in range(2):
        set_tp(rank, 2)
        with expert_parallel(True):
            moe = _build(config, router, tensors)
        assert moe.num_local_experts == E // 2 and TOP_K == 2
        total = total + _run(moe, x).double()
    torch.testing.assert_close(total, _reference(x, router, dense), atol=1e-4, rtol=1e-4)
