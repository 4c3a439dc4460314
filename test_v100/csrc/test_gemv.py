"""gemv (decode matrix-vector product, float16) vs a float64 reference, CUDA-graph replay, and
its argument checks (Meta kernel: run on CPU too)."""

from __future__ import annotations

import re

import pytest
import torch

from .op_cases import requires_gpu

gpu = [pytest.mark.gpu, requires_gpu]


def _case(m, n, k, *, bias, in_pad=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k + in_pad, generator=g).half().cuda()[:, :k]
    w = (torch.randn(n, k, generator=g) / k ** 0.5).half().cuda()
    b = torch.randn(n, generator=g).half().cuda() if bias else None
    return x, w, b


def _reference(x, w, b):
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(1, 8), (37, 520), (4096, 4096), (1000, 14336), (6, 2056)])
@pytest.mark.parametrize("rows_per_block", [0, 2, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_matches_float64_reference(device, m, n, k, rows_per_block, bias):
    # N not a multiple of the block's rows, K not a multiple of a block's 2048-element step.
    x, w, b = _case(m, n, k, bias=bias)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
    torch.ops._C.gemv(out, x, w, b, rows_per_block)
    expected = _reference(x, w, b)
    # FP32 accumulation, one FP16 rounding: |error| <= ~1 ulp of the result + summation noise.
    torch.testing.assert_close(out.double(), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_strided_rows_and_a_slice_of_a_wider_output(device):
    x, w, b = _case(3, 300, 1024, bias=True, in_pad=8, seed=1)
    assert x.stride(0) == 1032
    wide = torch.zeros(3, 310, dtype=torch.float16, device=device)
    torch.ops._C.gemv(wide[:, 5:305], x, w, b)
    torch.testing.assert_close(wide[:, 5:305].double(), _reference(x, w, b), atol=2e-3, rtol=2e-3)
    assert not wide[:, :5].any() and not wide[:, 305:].any(), "gemv wrote outside 'out'"


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_replays_in_a_cuda_graph(device):
    x, w, b = _case(1, 512, 2048, bias=False, seed=2)
    out = torch.empty(1, 512, dtype=torch.float16, device=device)
    torch.ops._C.gemv(out, x, w, b)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops._C.gemv(out, x, w, b)
    x.copy_(torch.randn(1, 2048, dtype=torch.float16, device=device))
    graph.replay()
    torch.testing.assert_close(out.double(), _reference(x, w, b), atol=2e-3, rtol=2e-3)


def _meta_args(**overrides):
    meta = dict(device="meta", dtype=torch.float16)
    args = dict(out=torch.empty(2, 64, **meta), input=torch.empty(2, 32, **meta), weight=torch.empty(64, 32, **meta),
                bias=None, rows_per_block=0)
    args.update(overrides)
    return args


def _meta(shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


BAD_ARGS = [
    (dict(input=_meta((2, 32), torch.float32)), "'input' must be float16, got float32"),
    (dict(weight=_meta((64, 32), torch.bfloat16)), "'weight' has dtype bfloat16 but 'input' has float16"),
    (dict(input=_meta((5, 32)), out=_meta((5, 64))), "'input' must have 1 to 4 rows, got 5"),
    (dict(weight=_meta((64, 40))), "'weight' must be [N, K] with K = input.size(1) = 32, got 40"),
    (dict(input=_meta((2, 12)), weight=_meta((64, 12))), "K (input features) must be a positive multiple of 8, got 12"),
    (dict(out=_meta((2, 63))), "'out' must be [M, N] = [2, 64]"),
    (dict(weight=_meta((32, 64)).t()), "'weight' must be contiguous"),
    (dict(input=_meta((32, 2)).t()), "'input' rows must be contiguous"),
    (dict(bias=_meta((63,))), "'bias' must be contiguous and 1-D of size N = 64"),
    (dict(rows_per_block=3), "'rows_per_block' must be 0 (automatic), 2, 4 or 8, got 3"),
    (dict(input=_meta(32)), "'input' [M, K], 'weight' [N, K] and 'out' [M, N] must be 2-D"),
]


@pytest.mark.parametrize("overrides,message", BAD_ARGS)
def test_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"gemv: {message}")):
        torch.ops._C.gemv(**_meta_args(**overrides))


def test_valid_meta_args_pass():
    torch.ops._C.gemv(**_meta_args())
    torch.ops._C.gemv(**_meta_args(bias=_meta(64), rows_per_block=8))
