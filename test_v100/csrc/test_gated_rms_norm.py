"""gated_rms_norm (the norm before a Gated DeltaNet layer's out_proj): the CUDA kernel against
transformers' RMSNormGated arithmetic in PyTorch (fla_ops.gated_rms_norm), strided gate rows
included; argument checks through the op's Meta kernel on any machine."""
from __future__ import annotations

import pytest
import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers import gdn_ops
from vllm_volta.model_executor.layers.fla_ops import gated_rms_norm as torch_gated_rms_norm

from .op_cases import requires_gpu, skip_unsupported


def _inputs(tokens: int, heads: int, dim: int, dtype: torch.dtype, device: str, gate_pad: int = 0):
    gen = torch.Generator().manual_seed(tokens * 31 + heads * 7 + dim)
    x = (torch.randn(tokens, heads * dim, generator=gen) * 3).to(dtype).to(device)
    # The gate as the layer slices it out of a wider projection: rows heads*dim + gate_pad apart.
    wide = torch.randn(tokens, heads * dim + gate_pad, generator=gen).to(dtype).to(device)
    gate = wide[:, gate_pad:]
    weight = (torch.rand(dim, generator=gen) + 0.5).to(dtype).to(device)
    return x, gate, weight


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,heads,dim,gate_pad", [(1, 32, 128, 0), (5, 32, 128, 9000), (67, 3, 40, 17),
                                                       (2, 1, 512, 0), (0, 4, 64, 0)])
def test_kernel_matches_the_pytorch_arithmetic(dtype, tokens, heads, dim, gate_pad):
    skip_unsupported("cuda", dtype)
    x, gate, weight = _inputs(tokens, heads, dim, dtype, "cuda", gate_pad)
    out = torch.full_like(x, float("nan"))
    ops.gated_rms_norm(out, x, gate, weight, 1e-6)
    ref = torch_gated_rms_norm(x.reshape(-1, dim), gate.reshape(-1, dim), weight, 1e-6).view(x.shape)
    # One rounding of the model dtype apart at most (rsqrt and the sum's order differ).
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    if tokens:
        torch.testing.assert_close(gdn_ops.gated_rms_norm(x, gate, weight, 1e-6), out, atol=0, rtol=0)


@pytest.mark.gpu
@requires_gpu
def test_opcheck():
    x, gate, weight = _inputs(3, 4, 64, torch.float16, "cuda", 5)
    torch.library.opcheck(torch.ops._C.gated_rms_norm.default, (torch.empty_like(x), x, gate, weight, 1e-5))


def test_fallback_is_the_pytorch_arithmetic():
    x, gate, weight = _inputs(4, 3, 16, torch.float32, "cpu", 7)
    ref = torch_gated_rms_norm(x.reshape(-1, 16), gate.reshape(-1, 16), weight, 1e-6).view(x.shape)
    torch.testing.assert_close(gdn_ops.gated_rms_norm(x, gate, weight, 1e-6), ref, atol=0, rtol=0)
    with pytest.raises(ValueError, match="gated_rms_norm: 'x' and 'gate' must be"):
        gdn_ops.gated_rms_norm(x, gate[:, :-1], weight, 1e-6)


@pytest.mark.parametrize("change,match", [
    (lambda a: dict(a, weight=a["weight"][:15]), "multiple of 'weight''s size 15"),
    (lambda a: dict(a, gate=a["gate"].half()), "'gate' has dtype float16 but 'x' has float32"),
    (lambda a: dict(a, out=a["out"][:2]), "'out' must have the same shape as 'x'"),
    (lambda a: dict(a, x=a["x"].view(4, 3, 16)), "'x' must be 2-D"),
    (lambda a: dict(a, eps=-1.0), "'epsilon' must be >= 0"),
])
def test_bad_arguments_name_the_argument(change, match):
    x, gate, weight = _inputs(4, 3, 16, torch.float32, "cpu")
    args = {"out": torch.empty_like(x), "x": x, "gate": gate, "weight": weight, "eps": 1e-6}
    a = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in change(args).items()}
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.gated_rms_norm(a["out"], a["x"], a["gate"], a["weight"], a["eps"])
