"""decode_gemv: linear layers route 1-2 float16 CUDA rows to the gemv kernel, all else to F.linear."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
    import vllm_volta._custom_ops as ops
    monkeypatch.setattr(ops, "gemv", lambda *a, **k: calls.append(1) or real_gemv(*a, **k))
    x = torch.randn(rows, 256, dtype=torch.float16, device=device)
    w = (torch.randn(96, 256, device=device) / 16).half()
    b = torch.randn(96, dtype=torch.float16, device=device)
    out = linear(x, w, b, use_gemv=True)
    assert len(calls) == (1 if rows <= 2 else 0)
    torch.testing.assert_close(out.double(), x.double() @ w.double().t() + b.double(), atol=2e-3, rtol=2e-3)
