"""decode_gemv: linear layers route 1-2 float16 CUDA rows to the gemv kernel, all else to F.linear."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers import decode_gemv
from vllm_volta.model_executor.layers.decode_gemv import gemv_applies, gemv_enabled, linear
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
    monkeypatch.setattr(decode_gemv, "_announced", True)
    import vllm_volta._custom_ops as ops
    monkeypatch.setattr(ops, "gemv", lambda *a, **k: calls.append(1) or real_gemv(*a, **k))
    x = torch.randn(rows, 256, dtype=torch.float16, device=device)
    w = (torch.randn(96, 256, device=device) / 16).half()
    b = torch.randn(96, dtype=torch.float16, device=device)
    out = linear(x, w, b, use_gemv=True)
    assert len(calls) == (1 if rows <= 2 else 0)
    torch.testing.assert_close(out.double(), x.double() @ w.double().t() + b.double(), atol=2e-3, rtol=2e-3)


def _modules(device, hidden=256, out=96, bias=True):
    from vllm_volta.model_executor.layers.layernorm import RMSNorm
    from vllm_volta.model_executor.layers.linear import ColumnParallelLinear

    torch.manual_seed(0)
    norm = RMSNorm(hidden, 1e-6, params_dtype=torch.float16).to(device)
    norm.weight.data = (1 + 0.1 * torch.randn(hidden, device=device)).half()
    layer = ColumnParallelLinear(hidden, out, bias=bias, params_dtype=torch.float16).to(device)
    layer.weight.data = (torch.randn(out, hidden, device=device) / hidden ** 0.5).half()
    if bias:
        layer.bias.data = torch.randn(out, device=device).half()
    return norm, layer


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_linear_fused_matches_unfused(device, rows, with_residual, monkeypatch):
    from vllm_volta.model_executor.layers.decode_gemv import rms_norm_linear

    norm, layer = _modules(device)
    assert layer.use_gemv
    x = torch.randn(rows, 256, device=device).half()
    residual = torch.randn(rows, 256, device=device).half() if with_residual else None
    calls = []
    real = torch.ops._C.rms_norm_gemv
    import vllm_volta._custom_ops as ops
    monkeypatch.setattr(ops, "rms_norm_gemv", lambda *a: calls.append(1) or real(*a))
    out, new_residual = rms_norm_linear(x.clone(), None if residual is None else residual.clone(), norm, layer)
    assert len(calls) == (1 if rows <= 2 else 0)
    layer.use_gemv = False  # the reference: the norm op, then cuBLAS
    ref_out, ref_residual = rms_norm_linear(x.clone(), None if residual is None else residual.clone(), norm, layer)
    assert torch.equal(new_residual, ref_residual)
    torch.testing.assert_close(out, ref_out, atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_act_linear_fused_matches_unfused(device, rows):
    from vllm_volta.model_executor.layers.activation import SiluAndMul
    from vllm_volta.model_executor.layers.decode_gemv import act_linear

    _, layer = _modules(device, hidden=128, out=64, bias=False)
    gate_up = (2 * torch.randn(rows, 256, device=device)).half()
    out = act_linear(gate_up, SiluAndMul(), layer)
    layer.use_gemv = False
    torch.testing.assert_close(out, act_linear(gate_up, SiluAndMul(), layer), atol=4e-3, rtol=4e-3)


def test_cpu_fallbacks_are_the_plain_ops():
    from vllm_volta.model_executor.layers.activation import SiluAndMul
    from vllm_volta.model_executor.layers.decode_gemv import act_linear, rms_norm_linear

    norm, layer = _modules("cpu")
    norm, layer = norm.float(), layer.float()
    x, residual = torch.randn(2, 256), torch.randn(2, 256)
    out, new_residual = rms_norm_linear(x.clone(), residual.clone(), norm, layer)
    assert torch.equal(new_residual, x + residual)
    expected_norm, _ = norm(x.clone(), residual.clone())
    assert torch.equal(out, F.linear(expected_norm, layer.weight, layer.bias))
    out0, same = rms_norm_linear(x, None, norm, layer)
    assert same is x and torch.equal(out0, F.linear(norm(x), layer.weight, layer.bias))
    gate_up = torch.randn(2, 192)
    small = torch.nn.Linear(96, 8).float()
    small.use_gemv, small.tp_size = False, 1
    assert torch.equal(act_linear(gate_up, SiluAndMul(), small), small(SiluAndMul()(gate_up)))
