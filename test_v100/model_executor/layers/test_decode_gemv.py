"""decode_gemv: linear layers route 1-2 float16 CUDA rows to the gemv kernel, all else to F.linear
(residual adds: to a GEMM accumulating into the residual)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.activation import SiluAndMul
from vllm_volta.model_executor.layers.decode_gemv import (add_linear_, gemv_applies, gemv_enabled, linear,
                                                          rope_cache_linear, silu_and_mul_linear,
                                                          split_silu_and_mul_linear)
from vllm_volta.model_executor.layers.rotary_embedding import get_rope
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.layers.linear import RowParallelLinear

gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_switch_and_kernel_availability(clean_env):
    from vllm_volta._custom_ops import has_cuda_kernel

    assert gemv_enabled() == has_cuda_kernel("gemv")
    clean_env.setenv("VLLM_VOLTA_DECODE_GEMV", "0")
    assert gemv_enabled() is False
    assert RowParallelLinear(16, 8).use_gemv is False


def test_cpu_inputs_take_f_linear():
    x, w, b = torch.randn(2, 16), torch.randn(8, 16), torch.randn(8)
    assert not gemv_applies(x, w)
    assert torch.equal(linear(x, w, b, use_gemv=True), F.linear(x, w, b))
    act = SiluAndMul()
    assert torch.equal(silu_and_mul_linear(x, w, b, True, act), act(F.linear(x, w, b)))
    norm = RMSNorm(16, 1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    assert torch.equal(linear(x, w, b, True, norm), F.linear(norm(x), w, b))
    assert torch.equal(silu_and_mul_linear(x, w, b, True, act, norm), act(F.linear(norm(x), w, b)))
    rope, cache = get_rope(8, 8, 64, 10000.0), torch.zeros(2, 2, 16, 1, 8)
    positions, slots = torch.tensor([3, 4]), torch.tensor([0, 1])
    assert rope_cache_linear(x, torch.randn(24, 16), None, True, norm, rope, positions, cache, slots) is None
    residual = torch.randn(2, 8)
    before = residual.clone()
    assert add_linear_(residual, x, w, b, use_gemv=True) is False  # a bias: only gemv adds it in place
    assert torch.equal(residual, before)
    assert add_linear_(residual, x, w, None, use_gemv=True) is True  # the GEMM accumulates
    torch.testing.assert_close(residual, before + F.linear(x, w))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_which_inputs_gemv_takes(device):
    w = torch.randn(64, 32, dtype=torch.float16, device=device)
    x = torch.randn(6, 40, dtype=torch.float16, device=device)
    assert gemv_applies(x[:2, :32], w) and gemv_applies(x[:1, :32], w)
    assert not gemv_applies(x[:3, :32], w)                      # more rows than gemv beats cuBLAS at
    assert not gemv_applies(x[:0, :32], w)                      # no rows
    assert not gemv_applies(x[:2, 1:33], w)                     # not 16-byte aligned
    assert not gemv_applies(x[:2, :32].float(), w.float())      # not float16
    assert not gemv_applies(x[:2, :32], w.t().contiguous().t())  # weight not contiguous


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("rows", [1, 2, 3, 17])
def test_matches_f_linear(device, rows, monkeypatch):
    calls = []
    real_gemv = torch.ops._C.gemv
    import vllm_volta._custom_ops as ops
    monkeypatch.setattr(ops, "gemv", lambda *a, **k: calls.append(1) or real_gemv(*a, **k))
    x = torch.randn(rows, 256, dtype=torch.float16, device=device)
    w = (torch.randn(96, 256, device=device) / 16).half()
    b = torch.randn(96, dtype=torch.float16, device=device)
    out = linear(x, w, b, use_gemv=True)
    assert len(calls) == (1 if rows <= 2 else 0)
    torch.testing.assert_close(out.double(), x.double() @ w.double().t() + b.double(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("use_gemv", [True, False])
def test_silu_and_mul_linear_matches_the_two_steps(device, rows, use_gemv, monkeypatch):
    calls = []
    real = torch.ops._C.gemv_silu_and_mul
    import vllm_volta._custom_ops as ops
    monkeypatch.setattr(ops, "gemv_silu_and_mul", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(rows, 256, dtype=torch.float16, device=device)
    w = (torch.randn(2 * 48, 256, device=device) / 16).half()
    b = torch.randn(2 * 48, dtype=torch.float16, device=device)
    act = SiluAndMul()
    out = silu_and_mul_linear(x, w, b, use_gemv, act)
    assert len(calls) == (1 if use_gemv and rows <= 2 else 0)
    gate_up = (x.double() @ w.double().t() + b.double()).half()
    expected = (F.silu(gate_up[:, :48].float()).half().float() * gate_up[:, 48:].float()).half()
    torch.testing.assert_close(out.double(), expected.double(), atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_gate_up_matches_silu_and_mul_of_the_merged_product(with_bias, dtype):
    """The V100 adapter build's path: two GEMMs and a contiguous silu * up, against the merged
    product and the silu_and_mul op (its CPU kernel is the adapter's composition)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 64, generator=g).to(dtype)
    w = (torch.randn(2 * 24, 64, generator=g) / 8).to(dtype)
    b = torch.randn(2 * 24, generator=g).to(dtype) if with_bias else None
    expected = SiluAndMul()(F.linear(x, w, b))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(split_silu_and_mul_linear(x, w, b), expected, **tol)


def _counting(monkeypatch, name):
    import vllm_volta._custom_ops as ops

    calls = []
    real = getattr(ops, name)
    monkeypatch.setattr(ops, name, lambda *a, **k: calls.append(k.get("norm_weight") is not None) or real(*a, **k))
    return calls


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("use_gemv", [True, False])
def test_norm_prologue_matches_norm_then_product(device, rows, use_gemv, monkeypatch):
    gemv_calls, gated_calls = _counting(monkeypatch, "gemv"), _counting(monkeypatch, "gemv_silu_and_mul")
    norm = RMSNorm(256, 1e-5).to(device=device, dtype=torch.float16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(rows, 256, dtype=torch.float16, device=device) * 4
    w = (torch.randn(96, 256, device=device) / 16).half()
    b = torch.randn(96, dtype=torch.float16, device=device)
    normed = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    out = linear(x, w, b, use_gemv, norm)
    torch.testing.assert_close(out.double(), normed @ w.double().t() + b.double(), atol=4e-3, rtol=4e-3)
    act = SiluAndMul()
    gated = silu_and_mul_linear(x, w, b, use_gemv, act, norm)
    gate_up = (normed @ w.double().t() + b.double()).half()
    expected = (F.silu(gate_up[:, :48].float()).half().float() * gate_up[:, 48:].float()).half()
    torch.testing.assert_close(gated.double(), expected.double(), atol=4e-3, rtol=4e-3)
    fused = use_gemv and rows <= 2
    assert gemv_calls == ([True] if fused else []) and gated_calls == ([True] if fused else [])


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_a_norm_weight_gemv_cannot_take_runs_the_norm_op(device, monkeypatch):
    gemv_calls = _counting(monkeypatch, "gemv")
    norm = RMSNorm(256, 1e-5).to(device=device, dtype=torch.float16)
    unaligned = (torch.rand(257, dtype=torch.float16, device=device) + 0.5)[1:]  # 2 bytes past a 16-byte boundary
    assert unaligned.data_ptr() % 16 != 0
    norm.weight = torch.nn.Parameter(unaligned, requires_grad=False)
    x = torch.randn(1, 256, dtype=torch.float16, device=device)
    w = (torch.randn(64, 256, device=device) / 16).half()
    out = linear(x, w, None, True, norm)
    assert gemv_calls == []
    torch.testing.assert_close(out, F.linear(norm(x), w), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_rope_cache_linear_declines_what_its_kernel_cannot_do(device):
    x = torch.randn(1, 64, dtype=torch.float16, device=device)
    w = (torch.randn(3 * 16, 64, device=device) / 8).half()  # one head of 16 each for q, k, v
    cache = torch.zeros(2, 2, 16, 1, 16, dtype=torch.float16, device=device)
    positions = torch.tensor([3], device=device)
    slots = torch.tensor([5], device=device)
    full = get_rope(16, 16, 64, 10000.0).to(device)
    out = rope_cache_linear(x, w, None, True, None, full, positions, cache, slots)
    q, k = full(positions, *F.linear(x, w).split([16, 16, 16], dim=1)[:2])
    torch.testing.assert_close(out[:, :16], q, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(cache[0].view(-1, 16)[5], k[0], atol=2e-3, rtol=2e-3)
    partial = get_rope(16, 8, 64, 10000.0).to(device)  # rotary_dim < head_size
    assert rope_cache_linear(x, w, None, True, None, partial, positions, cache, slots) is None
    assert rope_cache_linear(x, w, None, False, None, full, positions, cache, slots) is None  # gemv off
    assert rope_cache_linear(x, w, None, True, None, full, positions.int(), cache, slots) is None  # int32
    assert rope_cache_linear(x, w, None, True, None, full, positions, cache.float(), slots) is None


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("rows, use_gemv", [(2, True), (2, False), (3, True), (64, True)])
def test_add_linear_adds_into_the_residual(device, rows, use_gemv):
    # gemv_add (1-2 float16 CUDA rows with gemv on), else the GEMM accumulating into the residual.
    x = torch.randn(rows, 256, dtype=torch.float16, device=device)
    w = (torch.randn(64, 256, device=device) / 16).half()
    residual = torch.randn(rows, 64, dtype=torch.float16, device=device)
    expected = x.float() @ w.float().t() + residual.float()
    ptr = residual.data_ptr()
    assert add_linear_(residual, x, w, None, use_gemv=use_gemv)
    assert residual.data_ptr() == ptr
    torch.testing.assert_close(residual.float(), expected, atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_add_linear_declines_what_it_cannot_add_in_place(device):
    x = torch.randn(3, 256, dtype=torch.float16, device=device)
    w = (torch.randn(64, 256, device=device) / 16).half()
    residual = torch.randn(3, 64, dtype=torch.float16, device=device)
    before = residual.clone()
    assert not add_linear_(residual[:, :32], x, w[:32], None, use_gemv=True)      # residual not contiguous
    assert not add_linear_(residual.float(), x, w, None, use_gemv=True)           # not the input's dtype
    assert not add_linear_(residual[:2], x, w, None, use_gemv=True)               # not [rows, N]
    assert not add_linear_(residual, x[:, None], w, None, use_gemv=True)          # x not [rows, K]
    assert not add_linear_(residual, x, w, torch.zeros_like(w[:, 0]), use_gemv=True)  # a bias beyond gemv
    assert torch.equal(residual, before)
