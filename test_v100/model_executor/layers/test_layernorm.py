"""RMSNorm (on the _C ops) vs transformers' LlamaRMSNorm."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from vllm_volta.model_executor.layers.layernorm import RMSNorm

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_matches_transformers(device, dtype, tol):
    torch.manual_seed(0)
    hidden = 96
    ref = LlamaRMSNorm(hidden, eps=1e-5)
    ref.weight.data.normal_(1.0, 0.3)
    ours = RMSNorm(hidden, eps=1e-5).to(device, dtype)
    ours.weight.data.copy_(ref.weight.data)
    x, res = torch.randn(7, hidden), torch.randn(7, hidden)
    out = ours(x.to(device, dtype))
    torch.testing.assert_close(out.float().cpu(), ref(x), atol=tol, rtol=tol)

    # Fused residual form: returns (norm(x + res), x + res).
    xd, rd = x.to(device, dtype).clone(), res.to(device, dtype).clone()  # updated in place
    normed, new_res = ours(xd, rd)
    torch.testing.assert_close(new_res.float().cpu(), x + res, atol=tol, rtol=tol)
    torch.testing.assert_close(normed.float().cpu(), ref(x + res), atol=tol * 2, rtol=tol * 2)


def test_per_head_shape_and_validation():
    norm = RMSNorm(8)
    x = torch.randn(3, 4, 8)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), ref)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(8, eps=0.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_matches_the_ops_bitwise(device, dtype):
    """The layer may skip the op (where its kernel is the adapter's, the layer calls the ATen norm
    the adapter wraps); either way its results equal the registered kernels' bit for bit."""
    from vllm_volta import _custom_ops as ops
    torch.manual_seed(1)
    norm = RMSNorm(64, eps=1e-5).to(device, dtype)
    norm.weight.data.normal_(1.0, 0.3)
    x, res = (torch.randn(5, 64, device=device, dtype=dtype) * 3 for _ in range(2))

    want = torch.empty_like(x)
    ops.rms_norm(want, x, norm.weight, 1e-5)
    assert torch.equal(norm(x), want)

    want_x, want_res = x.clone(), res.clone()
    ops.fused_add_rms_norm(want_x, want_res, norm.weight, 1e-5)
    got_res = res.clone()
    normed, new_res = norm(x.clone(), got_res)
    assert new_res is got_res  # the sum lands in the caller's residual buffer
    assert torch.equal(new_res, want_res) and torch.equal(normed, want_x)

    empty = torch.empty(0, 64, device=device, dtype=dtype)
    assert norm(empty).shape == (0, 64)


def test_mismatched_weight_dtype_is_the_ops_error():
    norm = RMSNorm(8)  # fp32 weight
    with pytest.raises(RuntimeError, match="weight"):
        norm(torch.randn(2, 8, dtype=torch.float16))
