"""fp8_gemv / fp8_gemm / fp8_dequantize (FP8 e4m3fn weights converted with integer operations,
csrc/fp8_kernels.cu) against float64 references of the dequantized weight: the conversion of all 256
bytes against torch's float8_e4m3fn -> float16 (exact), the GEMV for 1-8 rows, the tensor-core GEMM
(K splits included) and the dequantize + cuBLAS path, for block, per-channel and per-tensor scales and
sizes that are not multiples of 128; the argument checks (Meta kernels) run without a GPU."""

from __future__ import annotations

import re

import pytest
import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.quantization.fp8_sm70 import fp8_w8a16_linear

from .op_cases import requires_gpu

FP8 = torch.float8_e4m3fn
_BUILT = (all(hasattr(torch.ops._C, op) for op in ("fp8_gemv", "fp8_gemm", "fp8_dequantize"))
          and "rows_per_block" in str(torch.ops._C.fp8_gemv.default._schema))
requires_op = pytest.mark.skipif(not _BUILT, reason="vllm_volta._C was built before the FP8 ops (rebuild it)")


def gpu(test):
    """Marked for the GPU run; skipped without CUDA or without the op in this build."""
    return pytest.mark.gpu(requires_gpu(requires_op(test)))


def _bf16_runs() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0) and _BUILT
            and ops.cuda_bf16_kernels_built())


# float16 everywhere; bfloat16 where the GPU (SM80+) and the build have it.
DTYPES = [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not _bf16_runs(), reason="bfloat16 kernels need an SM80+ GPU and build"))]
# Relative precision of one rounding to the dtype (float16: 11 bits, bfloat16: 8).
ROUNDING = {torch.float16: 2**-11, torch.bfloat16: 2**-8}

# (N, K): Qwen3-8B's o_proj, and sizes that are not multiples of 128 (K = 400: a last group of 16).
SHAPES = [(4096, 4096), (300, 400), (130, 272), (24, 4112)]


def random_fp8(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Every finite e4m3fn byte equally likely (denormals and +-448 included), no NaN."""
    b = torch.randint(0, 254, (n, k), generator=gen, dtype=torch.int32)
    b = b + (b >= 0x7F).int()  # skip 0x7F (NaN); 0xFF is past the range
    return b.to(torch.uint8).view(FP8)


def random_scales(kind: str, n: int, k: int, group: int, gen: torch.Generator) -> torch.Tensor:
    """fp8.py's scale rows [N, G] float32: block (128-row blocks, expanded), channel or tensor."""
    if kind == "block":
        blocks = torch.rand(-(-n // 128), -(-k // group), generator=gen) * 4e-3 + 1e-4
        return blocks.repeat_interleave(128, 0)[:n].contiguous()
    if kind == "channel":
        return torch.rand(n, 1, generator=gen) * 4e-3 + 1e-4
    return torch.full((n, 1), 2.5e-3)


def dense64(weight: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """W in float64: each weight times its row's scale for its group of ``group`` inputs."""
    w = weight.double()
    cols = torch.arange(w.shape[1]) // group if scales.shape[1] > 1 else torch.zeros(w.shape[1], dtype=torch.long)
    return w * scales.double()[:, cols]


@gpu
def test_all_256_bytes_convert_exactly():
    """fp8_dequantize with unit scales is the conversion: every byte (NaNs included) as torch does it."""
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).reshape(16, 16)
    out = torch.empty(16, 16, dtype=torch.float16, device="cuda")
    ops.fp8_dequantize(out, weight.cuda(), torch.ones(16, 1, device="cuda"), 16)
    want = weight.to(torch.float16)
    assert torch.equal(out.cpu().isnan(), want.isnan()) and int(want.isnan().sum()) == 2
    assert torch.equal(out.cpu().nan_to_num(), want.nan_to_num())
    assert torch.equal(out.cpu().view(torch.int16)[~want.isnan()], want.view(torch.int16)[~want.isnan()])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["block", "channel", "tensor"])
@pytest.mark.parametrize("n,k", SHAPES)
@gpu
def test_dequantize_matches_float64(n, k, kind, dtype):
    gen = torch.Generator().manual_seed(n + k)
    weight, scales = random_fp8(n, k, gen), random_scales(kind, n, k, 128, gen)
    out = torch.full((n, k), float("nan"), dtype=dtype, device="cuda")
    ops.fp8_dequantize(out, weight.cuda(), scales.cuda(), 128)
    want = dense64(weight, scales, 128)
    torch.testing.assert_close(out.double().cpu(), want, rtol=1.01 * ROUNDING[dtype], atol=2**-24)  # one rounding


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows_per_block", [0, 2, 4, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind,group", [("block", 128), ("block", 64), ("channel", 128), ("tensor", 128)])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", range(1, 9))
@gpu
def test_gemv_matches_float64(m, n, k, kind, group, bias, rows_per_block, dtype):
    """FP32 sums of exact products: within one rounding of the output to the dtype."""
    if rows_per_block == 8 and m > 2:
        pytest.skip("8 weight rows a block take up to 2 input rows")
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    weight, scales = random_fp8(n, k, gen), random_scales(kind, n, k, group, gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    ops.fp8_gemv(out, x.cuda(), weight.cuda(), scales.cuda(), group, None if b is None else b.cuda(), rows_per_block)
    want = x.double() @ dense64(weight, scales, group).t() + (0 if b is None else b.double())
    scale = want.abs().max().item()
    torch.testing.assert_close(out.double().cpu(), want, rtol=4 * ROUNDING[dtype], atol=2 * ROUNDING[dtype] * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [0, 1, 3])
@pytest.mark.parametrize("kind,group", [("block", 128), ("block", 32), ("channel", 128), ("tensor", 128)])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 9, 16, 17, 40, 64, 65, 130])
@gpu
def test_gemm_matches_float64(m, n, k, kind, group, split_k, dtype):
    """The weight tile is rounded to the dtype after scaling (as a dequantized weight): within that
    rounding of each weight, summed in FP32, then one rounding of the output."""
    gen = torch.Generator().manual_seed(m * 5 + n + k + split_k)
    weight, scales = random_fp8(n, k, gen), random_scales(kind, n, k, group, gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    ops.fp8_gemm(out, x.cuda(), weight.cuda(), scales.cuda(), group, b.cuda(), min(split_k, -(-k // 128)))
    want = x.double() @ dense64(weight, scales, group).t() + b.double()
    u = ROUNDING[dtype]
    torch.testing.assert_close(out.double().cpu(), want, rtol=10 * u, atol=4 * u * want.abs().max().item())


@gpu
def test_gemv_strided_rows_and_out():
    """Input rows a slice of a wider buffer (row stride a multiple of 8), out rows strided too."""
    gen = torch.Generator().manual_seed(3)
    n, k, m = 200, 256, 5
    weight, scales = random_fp8(n, k, gen), random_scales("block", n, k, 128, gen)
    wide = torch.randn(m, k + 64, generator=gen).half().cuda()
    out_wide = torch.zeros(m, n + 8, dtype=torch.float16, device="cuda")
    ops.fp8_gemv(out_wide[:, :n], wide[:, 32:32 + k], weight.cuda(), scales.cuda(), 128)
    want = wide[:, 32:32 + k].double().cpu() @ dense64(weight, scales, 128).t()
    torch.testing.assert_close(out_wide[:, :n].double().cpu(), want, rtol=2e-3, atol=1e-3 * want.abs().max().item())
    assert not out_wide[:, n:].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 8, 9, 64, 128, 129, 300])
@pytest.mark.parametrize("kind", ["block", "channel"])
@gpu
def test_linear_every_path_matches_float64(rows, kind, dtype):
    """fp8_w8a16_linear: fp8_gemv up to 8 rows, fp8_gemm up to 128, fp8_dequantize + cuBLAS above;
    [..., K] inputs."""
    gen = torch.Generator().manual_seed(rows)
    n, k = 384, 528
    weight, scales = random_fp8(n, k, gen), random_scales(kind, n, k, 128, gen)
    x = torch.randn(1, rows, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    got = fp8_w8a16_linear(x.cuda(), weight.cuda(), scales.cuda(), 128, b.cuda())
    want = x.double() @ dense64(weight, scales, 128).t() + b.double()
    assert got.shape == (1, rows, n) and got.dtype == dtype
    u = ROUNDING[dtype]
    torch.testing.assert_close(got.double().cpu(), want, rtol=20 * u, atol=4 * u * want.abs().max().item())


@gpu
def test_opcheck():
    gen = torch.Generator().manual_seed(0)
    weight, scales = random_fp8(64, 256, gen).cuda(), random_scales("block", 64, 256, 128, gen).cuda()
    x = torch.randn(3, 256, generator=gen).half().cuda()
    torch.library.opcheck(torch.ops._C.fp8_gemv.default,
                          (torch.empty(3, 64, dtype=torch.float16, device="cuda"), x, weight, scales, 128, None, 2))
    torch.library.opcheck(torch.ops._C.fp8_gemm.default,
                          (torch.empty(3, 64, dtype=torch.float16, device="cuda"), x, weight, scales, 128, None, 2))
    torch.library.opcheck(torch.ops._C.fp8_dequantize.default,
                          (torch.empty(64, 256, dtype=torch.float16, device="cuda"), weight, scales, 128))


def _m(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _meta(**overrides):
    args = dict(out=_m(2, 64), input=_m(2, 256), weight=_m(64, 256, dtype=FP8), scales=_m(64, 2, dtype=torch.float32),
                group_k=128, bias=None, rows_per_block=0)
    return args | overrides


BAD = [
    (dict(input=_m(9, 256), out=_m(9, 64)), "'input' must have 1 to 8 rows, got 9"),
    (dict(weight=_m(64, 256)), "'weight' must be a 2-D float8_e4m3fn tensor [N, K]"),
    (dict(scales=_m(64, 2)), "'scales' must be a 2-D float32 tensor [N, G]"),
    (dict(scales=_m(64, 3, dtype=torch.float32)), "'scales' must be [N, 1] or [N, ceil(K / group_k)] = [64, 2], got [64, 3]"),
    (dict(group_k=100), "'group_k' must be a positive multiple of 16, got 100"),
    (dict(weight=_m(64, 200, dtype=FP8), input=_m(2, 200)), "K (input features) must be a positive multiple of 16"),
    (dict(input=_m(2, 128)), "'input' must be a float16 or bfloat16 tensor [M, 256]"),
    (dict(input=_m(2, 256, dtype=torch.float32), out=_m(2, 64, dtype=torch.float32)),
     "'input' must be a float16 or bfloat16 tensor [M, 256]"),
    (dict(out=_m(2, 64, dtype=torch.bfloat16)), "'out' has dtype bfloat16 but 'input' has float16; they must match"),
    (dict(out=_m(2, 63)), "'out' must be [2, 64]"),
    (dict(bias=_m(64, dtype=torch.float32)), "'bias' has dtype float32 but 'input' has float16; they must match"),
    (dict(bias=_m(63)), "'bias' must be a contiguous 1-D tensor [64]"),
    (dict(rows_per_block=3), "'rows_per_block' must be 0 (automatic), 2, 4 or 8 (8: up to 2 input rows), got 3"),
    (dict(rows_per_block=8, input=_m(3, 256), out=_m(3, 64)), "'rows_per_block' must be 0 (automatic), 2, 4 or 8"),
]


@requires_op
@pytest.mark.parametrize("overrides,message", BAD)
def test_gemv_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"fp8_gemv: {message}")):
        torch.ops._C.fp8_gemv(**_meta(**overrides))
    torch.ops._C.fp8_gemv(**_meta())  # the valid arguments pass
    torch.ops._C.fp8_gemv(**_meta(scales=_m(64, 1, dtype=torch.float32), group_k=16, bias=_m(64)))
    torch.ops._C.fp8_gemv(**_meta(input=_m(2, 256, dtype=torch.bfloat16), out=_m(2, 64, dtype=torch.bfloat16)))
    torch.ops._C.fp8_gemv(**_meta(rows_per_block=8))


@requires_op
def test_dequantize_bad_out_is_a_clear_error():
    args = dict(weight=_m(64, 256, dtype=FP8), scales=_m(64, 2, dtype=torch.float32), group_k=128)
    torch.ops._C.fp8_dequantize(out=_m(64, 256), **args)
    torch.ops._C.fp8_dequantize(out=_m(64, 256, dtype=torch.bfloat16), **args)
    with pytest.raises(RuntimeError, match=re.escape("fp8_dequantize: 'out' must be a float16 or bfloat16 tensor "
                                                     "[64, 256]")):
        torch.ops._C.fp8_dequantize(out=_m(64, 128), **args)


@requires_op
def test_gemm_bad_input_is_a_clear_error():
    args = _meta(input=_m(300, 256), out=_m(300, 64))
    del args["rows_per_block"]
    torch.ops._C.fp8_gemm(**args, split_k=2)  # any number of rows
    with pytest.raises(RuntimeError, match=re.escape("fp8_gemm: 'split_k' must be 0 (automatic) or 1 to "
                                                     "ceil(K / 128) = 2, got 3")):
        torch.ops._C.fp8_gemm(**args, split_k=3)
    with pytest.raises(RuntimeError, match=re.escape("fp8_gemm: 'out' must be [300, 64]")):
        torch.ops._C.fp8_gemm(**(args | {"out": _m(299, 64)}), split_k=0)
