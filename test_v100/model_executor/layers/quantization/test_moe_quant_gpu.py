"""Quantized MoE layers on a GPU in float16 (4-bit AWQ / compressed-tensors, FP8 block) against the
dequantized weights' MoE in float64: the 4-bit GEMVs (up to 8 pairs per expert), the gathered FP8
experts (a pair per expert at most) and the dequantized chunks + grouped GEMM (above), with experts that get no token, all
tokens on one expert, expert parallelism's masked pairs; a decode step replayed in a CUDA graph
gives the eager result. Skips without CUDA."""

from __future__ import annotations

import pytest
import torch

import torch.nn.functional as F

from test_v100.model_executor.layers.quantization.test_moe_quant import E, H, _build, _checkpoint
from vllm_volta.model_executor.layers import fused_moe_quant
from vllm_volta.model_executor.layers.expert_parallel import expert_parallel
from vllm_volta.model_executor.layers.moe import supports_cuda_graphs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CASES = [("w4", "awq", 32, False), ("w4", "compressed-tensors", -1, True), ("fp8", "block", 32, False)]


def _reference(moe, x: torch.Tensor, dense: dict) -> torch.Tensor:
    """The dequantized experts in float64 on the layer's own routing (a float16 router may break
    a near tie differently from a float32 one; the routing is not what is tested here)."""
    ids, weights = moe.route(x)
    ids, weights, x = ids.cpu().long(), weights.cpu().double(), x.cpu().double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = F.silu(dense["gate"][e] @ x[t]) * (dense["up"][e] @ x[t])
            out[t] += weights[t, j] * (dense["down"][e] @ h)
    return out


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    err = (got.double().cpu() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item() + 2e-3, f"max error {err} vs scale {ref.abs().max().item()}"


def _cuda_layer(case, seed=0):
    kind, fmt, group, sym = case
    config, router, tensors, dense = _checkpoint(kind, fmt, group, sym, seed=seed)
    torch.set_default_dtype(torch.float16)
    try:
        moe = _build(config, router, tensors)
    finally:
        torch.set_default_dtype(torch.float32)
    return moe.cuda(), router, dense


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("tokens", [1, 3, 8, 24, 40])  # 4-bit GEMVs up to 48 pairs, FP8 gathered up to 6; chunks
def test_device_path_matches_float64(case, tokens, monkeypatch):
    moe, router, dense = _cuda_layer(case)
    assert moe.device_path_reason() is None and supports_cuda_graphs(moe)
    monkeypatch.setattr(fused_moe_quant, "CHUNK_BYTES", 2 * 3 * H * H * 2)  # two experts a chunk: three chunks
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens)).half().cuda()
    _close(moe(x), _reference(moe, x, dense))


@pytest.mark.parametrize("case", CASES[:1] + CASES[2:], ids=lambda c: f"{c[0]}-{c[1]}")
def test_one_expert_for_all_and_idle_experts(case):
    moe, router, dense = _cuda_layer(case, seed=2)
    # A router that sends every token to experts 0 and 1 (the rest get no token).
    bias = torch.zeros(E, H)
    bias[0, 0], bias[1, 0] = 50.0, 40.0
    moe.gate.weight.data.copy_((router + bias).half())
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(5)).half()
    x[:, 0] = 1.0
    x = x.cuda()
    assert set(moe.route(x)[0].flatten().tolist()) == {0, 1}
    _close(moe(x), _reference(moe, x, dense))


def test_expert_parallel_shares_sum(set_tp, monkeypatch):
    monkeypatch.setattr("vllm_volta.model_executor.layers.moe.tensor_model_parallel_all_reduce", lambda t: t)
    x = torch.randn(3, H, generator=torch.Generator().manual_seed(9)).half().cuda()
    total = None
    for rank in range(2):
        set_tp(rank, 2)
        with expert_parallel(True):
            moe, router, dense = _cuda_layer(CASES[0], seed=3)
        part = moe(x).double()
        total = part if total is None else total + part
    _close(total, _reference(moe, x, dense))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_cuda_graph_replay(case):
    moe, _, _ = _cuda_layer(case)
    x = torch.randn(2, H, device="cuda").half()
    eager = moe(x)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        moe(x)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe(x)
    x.copy_(torch.randn(2, H, device="cuda").half())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, moe(x))
    assert not torch.equal(out, eager)
