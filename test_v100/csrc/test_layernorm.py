"""rms_norm / fused_add_rms_norm (csrc: native kernels, V100 adapter, CPU) vs plain PyTorch."""

from __future__ import annotations

import re

import pytest
import torch

from .op_cases import DEVICE_LIBS, DTYPES, TOLERANCES, lib, requires_gpu, rows_with_stride, skip_unsupported

EPS = 1e-6
HIDDEN_SIZES = [1, 7, 33, 4096, 4097]


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 statistics, normalized value rounded to the dtype, then times the weight in the
    dtype (Hugging Face LlamaRMSNorm / vLLM semantics)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def make_weight(hidden: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).to(device)


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("pad", [0, 8, 3], ids=["contiguous", "row-stride-aligned", "row-stride-odd"])
def test_rms_norm_matches_reference(device, namespace, dtype, hidden, pad):
    skip_unsupported(device, dtype)
    x = rows_with_stride(5, hidden, pad, dtype=dtype, device=device)
    weight = make_weight(hidden, dtype, device)
    out = torch.empty(x.shape, dtype=dtype, device=device)
    x_before = x.clone()
    lib(namespace).rms_norm(out, x, weight, EPS)
    torch.testing.assert_close(out, rms_norm_ref(x_before, weight, EPS), **TOLERANCES[dtype])
    assert torch.equal(x, x_before), "rms_norm must not modify its input"


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("pad", [0, 8], ids=["contiguous", "row-stride"])
def test_fused_add_rms_norm_matches_reference(device, namespace, dtype, hidden, pad):
    skip_unsupported(device, dtype)
    x = rows_with_stride(5, hidden, pad, dtype=dtype, device=device, seed=2)
    residual = rows_with_stride(5, hidden, 0, dtype=dtype, device=device, seed=3).contiguous()
    weight = make_weight(hidden, dtype, device)
    expected_residual = x + residual
    expected_out = rms_norm_ref(expected_residual, weight, EPS)
    lib(namespace).fused_add_rms_norm(x, residual, weight, EPS)
    torch.testing.assert_close(residual, expected_residual, **TOLERANCES[dtype])
    torch.testing.assert_close(x, expected_out, **TOLERANCES[dtype])


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
def test_rms_norm_3d_and_empty(device, namespace):
    ops = lib(namespace)
    big = torch.randn(2, 3, 72, dtype=torch.float16, device=device)
    x = big[:, :, :64]  # leading dims collapse into one row stride of 72
    weight = make_weight(64, torch.float16, device)
    out = torch.empty(x.shape, dtype=x.dtype, device=device)
    ops.rms_norm(out, x, weight, EPS)
    torch.testing.assert_close(out, rms_norm_ref(x, weight, EPS), **TOLERANCES[torch.float16])

    empty = torch.empty(0, 64, dtype=torch.float16, device=device)
    ops.rms_norm(torch.empty_like(empty), empty, weight, EPS)  # no rows: a no-op, no error


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
def test_norm_opcheck(device, namespace):
    ops = lib(namespace)
    x = rows_with_stride(3, 40, 8, dtype=torch.float16, device=device)
    weight = make_weight(40, torch.float16, device)
    torch.library.opcheck(ops.rms_norm.default, (torch.empty(3, 40, dtype=x.dtype, device=device), x, weight, EPS))
    residual = torch.randn(3, 40, dtype=x.dtype, device=device)
    torch.library.opcheck(ops.fused_add_rms_norm.default, (x.clone(), residual, weight, EPS))


def _bad_calls(device: str):
    f16 = dict(dtype=torch.float16, device=device)
    x, w, out = torch.randn(4, 8, **f16), torch.ones(8, **f16), torch.empty(4, 8, **f16)
    return [
        ((out, x, w.float(), EPS), "rms_norm: 'weight' has dtype float32 but 'input' has float16"),
        ((out, x, torch.ones(9, **f16), EPS), "rms_norm: 'weight' must be 1-D of size hidden_size=8"),
        ((torch.empty(4, 9, **f16), x, w, EPS), "rms_norm: 'result' must have the same shape as 'input'"),
        ((out.int(), x.int(), w, EPS), "rms_norm: 'input' must be float32, float16 or bfloat16"),
        ((out, x, w, -1.0), "rms_norm: 'epsilon' must be >= 0"),
        ((out.t().contiguous().t(), x, w, EPS), "rms_norm: 'result' must be contiguous"),
        ((torch.empty(8, 4, **f16), x.t(), torch.ones(4, **f16), EPS), "rms_norm: 'input' must be contiguous in its last dimension"),
    ]


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
def test_rms_norm_bad_input_names_op_and_argument(device, namespace):
    for args, message in _bad_calls(device):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            lib(namespace).rms_norm(*args)


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
def test_rows_that_cannot_be_flattened_are_rejected(device, namespace):
    x = torch.randn(2, 3, 8, dtype=torch.float16, device=device)[:, :2, :]  # stride(0) != 2 * stride(1)
    weight = torch.ones(8, dtype=torch.float16, device=device)
    with pytest.raises(RuntimeError, match="rms_norm: 'input' rows must be evenly strided"):
        lib(namespace).rms_norm(torch.empty(2, 2, 8, dtype=x.dtype, device=device), x, weight, EPS)


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
def test_fused_add_rms_norm_bad_input(device, namespace):
    f16 = dict(dtype=torch.float16, device=device)
    x, w = torch.randn(4, 8, **f16), torch.ones(8, **f16)
    with pytest.raises(RuntimeError, match="fused_add_rms_norm: 'residual' must have the same shape as 'input'"):
        lib(namespace).fused_add_rms_norm(x, torch.randn(4, 16, **f16), w, EPS)
    with pytest.raises(RuntimeError, match="fused_add_rms_norm: 'residual' has dtype float32"):
        lib(namespace).fused_add_rms_norm(x, torch.randn(4, 8, dtype=torch.float32, device=device), w, EPS)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("namespace", ["_C", "_C_adapter"])
def test_device_mismatch_is_an_error(namespace):
    x = torch.randn(4, 8, dtype=torch.float16, device="cuda")
    with pytest.raises(RuntimeError, match="rms_norm: 'weight' and 'input' must be on the same device"):
        lib(namespace).rms_norm(torch.empty_like(x), x, torch.ones(8, dtype=torch.float16), EPS)
