"""awq_dequantize / awq_gemv (CUDA kernels) against the weight written out from the AWQ format in
float64, and their argument checks (Meta kernels: run on CPU too)."""

from __future__ import annotations

import re

import pytest
import torch

from test_v100.model_executor.layers.quantization.checkpoints import pack, random_quantized
from vllm_volta import _custom_ops as ops

from .op_cases import requires_gpu

SHAPES = [(4096, 4096, 128), (1536, 2056, 128), (96, 64, 32), (8960, 1536, 128)]  # (K, N, group)


def _packed(k, n, group, seed=0):
    q, z, s, w = random_quantized(k, n, group, torch.Generator().manual_seed(seed))
    return pack(q).cuda(), pack(z).cuda(), s.cuda(), w


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("k,n,group", SHAPES)
def test_dequantize_matches_the_format(k, n, group):
    qweight, qzeros, scales, w = _packed(k, n, group)
    out = torch.full((k, n), float("nan"), dtype=torch.float16, device="cuda")
    ops.awq_dequantize(out, qweight, qzeros, scales)
    torch.testing.assert_close(out.double().cpu(), w, atol=1e-3, rtol=1e-3)  # one fp16 rounding


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("k,n,group", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_gemv_matches_x_w(k, n, group, m):
    qweight, qzeros, scales, w = _packed(k, n, group, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(9)).half()
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    ops.awq_gemv(out, x.cuda(), qweight, qzeros, scales)
    want = x.double() @ w
    scale = want.abs().max().item()
    torch.testing.assert_close(out.double().cpu(), want, atol=2e-3 * scale, rtol=2e-3)


def _meta(**overrides):
    meta = dict(device="meta")
    args = dict(out=torch.empty(2, 64, dtype=torch.float16, **meta), input=torch.empty(2, 128, dtype=torch.float16, **meta),
                qweight=torch.empty(128, 8, dtype=torch.int32, **meta),
                qzeros=torch.empty(4, 8, dtype=torch.int32, **meta),
                scales=torch.empty(4, 64, dtype=torch.float16, **meta))
    return args | overrides


BAD = [
    (dict(input=torch.empty(5, 128, dtype=torch.float16, device="meta"),
          out=torch.empty(5, 64, dtype=torch.float16, device="meta")), "'input' must have 1 to 4 rows, got 5"),
    (dict(qweight=torch.empty(128, 8, dtype=torch.int64, device="meta")), "'qweight' must be a 2-D int32 tensor"),
    (dict(scales=torch.empty(4, 64, dtype=torch.float32, device="meta")), "'scales' must be a 2-D float16 tensor"),
    (dict(qzeros=torch.empty(3, 8, dtype=torch.int32, device="meta")), "'qzeros' has 3 rows, which must divide"),
    (dict(scales=torch.empty(4, 56, dtype=torch.float16, device="meta")), "'qzeros' must be [4, 8] and 'scales' [4, 64]"),
    (dict(input=torch.empty(2, 100, dtype=torch.float16, device="meta")), "'input' must be a float16 tensor [M, 128]"),
    (dict(out=torch.empty(2, 64, dtype=torch.float32, device="meta")), "'out' must be a float16 tensor [2, 64]"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_gemv_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"awq_gemv: {message}")):
        torch.ops._C.awq_gemv(**_meta(**overrides))
    torch.ops._C.awq_gemv(**_meta())  # the valid arguments pass


def test_dequantize_bad_out_is_a_clear_error():
    args = _meta()
    args.pop("input")
    torch.ops._C.awq_dequantize(**(args | {"out": torch.empty(128, 64, dtype=torch.float16, device="meta")}))
    with pytest.raises(RuntimeError, match=re.escape("awq_dequantize: 'out' must be a float16 tensor [128, 64]")):
        torch.ops._C.awq_dequantize(**args)
