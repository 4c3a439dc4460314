from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.activation import GeluAndMul, SiluAndMul, get_act_and_mul_fn


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3)])
def test_silu_and_mul(dtype, tol):
    x = torch.randn(5, 2 * 24).to(dtype)
    out = SiluAndMul()(x)
    ref = F.silu(x[:, :24].float()) * x[:, 24:].float()
    assert out.shape == (5, 24) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_gelu_and_mul(approximate, dtype, tol, device):
    """The fused op against the GELU written out in float64: 0.5 x (1 + erf(x / sqrt 2)), or its
    tanh approximation."""
    x = (2 * torch.randn(5, 2 * 24)).to(dtype)
    gate, up = x[:, :24].double(), x[:, 24:].double()
    if approximate == "tanh":
        gelu = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate ** 3)))
    else:
        gelu = 0.5 * gate * (1 + torch.erf(gate / 2 ** 0.5))
    out = GeluAndMul(approximate)(x.to(device))
    assert out.shape == (5, 24) and out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), gelu * up, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        GeluAndMul("sigmoid")


def test_get_act_and_mul_fn():
    assert isinstance(get_act_and_mul_fn("silu"), SiluAndMul)
    assert get_act_and_mul_fn("gelu_pytorch_tanh").approximate == "tanh"
    assert get_act_and_mul_fn("gelu").approximate == "none"
    with pytest.raises(ValueError, match="hidden_act 'relu' is not supported; supported: 'silu'"):
        get_act_and_mul_fn("relu")
