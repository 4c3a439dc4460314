from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.activation import SiluAndMul, get_act_and_mul_fn


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3)])
def test_silu_and_mul(dtype, tol):
    x = torch.randn(5, 2 * 24).to(dtype)
    out = SiluAndMul()(x)
    ref = F.silu(x[:, :24].float()) * x[:, 24:].float()
    assert out.shape == (5, 24) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_get_act_and_mul_fn():
    assert isinstance(get_act_and_mul_fn("silu"), SiluAndMul)
    with pytest.raises(ValueError, match="hidden_act"):
        get_act_and_mul_fn("relu")
