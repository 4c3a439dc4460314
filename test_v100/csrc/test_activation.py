"""silu_and_mul / gelu_and_mul / gelu_tanh_and_mul (csrc) vs plain PyTorch."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from .op_cases import DEVICE_LIBS, DTYPES, TOLERANCES, lib, rows_with_stride, skip_unsupported

# op name -> reference activation (PyTorch rounds it to the dtype before the multiply too).
ACTIVATIONS = {
    "silu_and_mul": F.silu,
    "gelu_and_mul": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh_and_mul": lambda x: F.gelu(x, approximate="tanh"),
}


def act_and_mul_ref(op: str, x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return ACTIVATIONS[op](x[..., :d]) * x[..., d:]


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
@pytest.mark.parametrize("op", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 7, 33, 4096, 4097])
@pytest.mark.parametrize("pad", [0, 16, 3], ids=["contiguous", "row-stride-aligned", "row-stride-odd"])
def test_act_and_mul_matches_reference(device, namespace, op, dtype, d, pad):
    skip_unsupported(device, dtype)
    x = rows_with_stride(3, 2 * d, pad, dtype=dtype, device=device)
    out = torch.empty(3, d, dtype=dtype, device=device)
    getattr(lib(namespace), op)(out, x)
    torch.testing.assert_close(out, act_and_mul_ref(op, x), **TOLERANCES[dtype])


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_act_and_mul_3d_empty_and_opcheck(device, namespace, op):
    fn = getattr(lib(namespace), op)
    x = torch.randn(2, 3, 40, dtype=torch.float16, device=device)
    out = torch.empty(2, 3, 20, dtype=x.dtype, device=device)
    fn(out, x)
    torch.testing.assert_close(out, act_and_mul_ref(op, x), **TOLERANCES[torch.float16])
    fn(torch.empty(0, 20, dtype=x.dtype, device=device), torch.empty(0, 40, dtype=x.dtype, device=device))
    torch.library.opcheck(getattr(lib(namespace), op).default, (out, x[:, :, :40]))
    torch.library.opcheck(getattr(lib(namespace), op).default,
                          (torch.empty(3, 16, dtype=x.dtype, device=device), rows_with_stride(3, 32, 8, dtype=x.dtype, device=device)))


@pytest.mark.parametrize("device,namespace", DEVICE_LIBS)
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_act_and_mul_bad_input_names_op_and_argument(device, namespace, op):
    fn = getattr(lib(namespace), op)
    out_arg = "result" if op == "silu_and_mul" else "out"  # vLLM's schema names
    f16 = dict(dtype=torch.float16, device=device)
    x = torch.randn(4, 8, **f16)
    cases = [
        ((torch.empty(4, 4, **f16), torch.randn(4, 7, **f16)), f"{op}: last dim of 'input' must be even"),
        ((torch.empty(4, 8, **f16), x), f"{op}: '{out_arg}' must have the shape of 'input' with last dim 4"),
        ((torch.empty(4, 4, dtype=torch.float32, device=device), x), f"{op}: '{out_arg}' has dtype float32"),
        ((torch.empty(4, 4, dtype=torch.int32, device=device), x.int()), f"{op}: 'input' must be float32, float16 or bfloat16"),
        ((torch.empty(4, 8, **f16)[:, :4], x), f"{op}: '{out_arg}' must be contiguous"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            fn(*args)
