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
