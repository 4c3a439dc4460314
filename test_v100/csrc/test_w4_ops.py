"""w4_dequantize / w4_gemv / w4_gemm (CUDA kernels on the K-major 4-bit layout) against the
weight written out in float64 from the published AWQ format, through the layout's repacking; and
their argument checks (Meta kernels: run on CPU too)."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from test_v100.model_executor.layers.quantization.checkpoints import pack, random_quantized
from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.quantization.w4_layout import repack_awq

from .op_cases import requires_gpu

# (K, N, group): Llama shapes; 3 and 5 groups; K not a multiple of the GEMM's 64-wide K step;
# N not a multiple of any block; one group (per channel); group 64.
SHAPES = [(4096, 4096, 128), (14336, 512, 128), (96, 72, 32), (160, 200, 32), (1024, 136, 1024), (256, 40, 64)]
GEMM_TILES = [(16, 64, 1), (16, 128, 3), (32, 32, 2), (32, 64, 1), (64, 64, 4), (64, 128, 1), (64, 32, 2)]


@functools.lru_cache(maxsize=4)
def _weights(k, n, group):
    q, z, s, w = random_quantized(k, n, group, torch.Generator().manual_seed(k + n))
    qweight, sz = repack_awq(pack(q).cuda(), pack(z).cuda(), s.cuda())
    return qweight, sz, w


def _x(m, k, seed=9):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).half()


def _check(out, x, w, tol):
    want = x.double() @ w
    scale = want.abs().max().item()
    torch.testing.assert_close(out.double().cpu(), want, atol=tol * scale, rtol=tol)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("k,n,group", SHAPES)
def test_dequantize_matches_the_format(k, n, group):
    qweight, sz, w = _weights(k, n, group)
    out = torch.full((n, k), float("nan"), dtype=torch.float16, device="cuda")
    ops.w4_dequantize(out, qweight, sz)
    torch.testing.assert_close(out.t().double().cpu(), w, atol=1e-3, rtol=1e-3)  # one fp16 rounding


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("k,n,group", SHAPES)
@pytest.mark.parametrize("m", range(1, 9))
def test_gemv_matches_x_w(k, n, group, m):
    qweight, sz, w = _weights(k, n, group)
    x = _x(m, k)
    for rows_per_warp in (1, 2, 4) if m <= 4 else (1, 2):
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        ops.w4_gemv(out, x.cuda(), qweight, sz, rows_per_warp)
        _check(out, x, w, 2e-3)  # float16 weights, float16 sums of 16 products, then float32


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("k,n,group", SHAPES)
@pytest.mark.parametrize("m", [9, 16, 17, 33, 64, 100, 256])
def test_gemm_matches_x_w(k, n, group, m):
    qweight, sz, w = _weights(k, n, group)
    x = _x(m, k)
    for block_m, block_n, splits in GEMM_TILES:
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        ops.w4_gemm(out, x.cuda(), qweight, sz, block_m, block_n, splits)
        _check(out, x, w, 1e-3)  # float16 weights, float32 accumulation


@pytest.mark.gpu
@requires_gpu
def test_gemm_is_graph_capturable_with_splits():
    qweight, sz, w = _weights(512, 96, 128)
    x = _x(20, 512).cuda()
    out = torch.empty(20, 96, dtype=torch.float16, device="cuda")
    ops.w4_gemm(out, x, qweight, sz, 16, 64, 4)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.w4_gemm(out, x, qweight, sz, 16, 64, 4)
        ops.w4_gemv(out[:3], x[:3], qweight, sz, 2)
    out.fill_(float("nan"))
    graph.replay()
    _check(out, x.cpu(), w, 2e-3)


def _meta(m=2, **overrides):
    meta = dict(device="meta")
    args = dict(out=torch.empty(m, 64, dtype=torch.float16, **meta), input=torch.empty(m, 128, dtype=torch.float16, **meta),
                qweight=torch.empty(64, 16, dtype=torch.int32, **meta), sz=torch.empty(64, 4, 2, dtype=torch.float16, **meta))
    return args | overrides


BAD_GEMV = [
    (dict(input=torch.empty(9, 128, dtype=torch.float16, device="meta"),
          out=torch.empty(9, 64, dtype=torch.float16, device="meta")), 1, "'input' must have 1 to 8 rows, got 9"),
    (dict(), 3, "'rows_per_warp' must be 1, 2 or 4, got 3"),
    (dict(input=torch.empty(5, 128, dtype=torch.float16, device="meta"),
          out=torch.empty(5, 64, dtype=torch.float16, device="meta")), 4, "'rows_per_warp' must be 1 or 2 above 4"),
    (dict(qweight=torch.empty(64, 16, dtype=torch.int64, device="meta")), 1, "'qweight' must be a 2-D int32 tensor"),
    (dict(qweight=torch.empty(64, 10, dtype=torch.int32, device="meta"),
          input=torch.empty(2, 80, dtype=torch.float16, device="meta")), 1, "'qweight' must be [N, K / 8] with K a positive multiple of 32, got K = 80"),
    (dict(sz=torch.empty(64, 4, dtype=torch.float16, device="meta")), 1, "'sz' must be a 3-D float16 tensor"),
    (dict(sz=torch.empty(64, 3, 2, dtype=torch.float16, device="meta")), 1, "'sz' must be [64, groups, 2] with groups dividing K = 128, got [64, 3, 2]"),
    (dict(qweight=torch.empty(64, 24, dtype=torch.int32, device="meta"),
          input=torch.empty(2, 192, dtype=torch.float16, device="meta"),
          sz=torch.empty(64, 2, 2, dtype=torch.float16, device="meta")), 1, "the group size K / groups = 96 must be 32 times a power of two"),
    (dict(input=torch.empty(2, 100, dtype=torch.float16, device="meta")), 1, "'input' must be a float16 tensor [M, 128]"),
    (dict(out=torch.empty(2, 64, dtype=torch.float32, device="meta")), 1, "'out' must be a float16 tensor [2, 64]"),
]


@pytest.mark.parametrize("overrides,rows_per_warp,message", BAD_GEMV)
def test_gemv_bad_input_is_a_clear_error(overrides, rows_per_warp, message):
    with pytest.raises(RuntimeError, match=re.escape(f"w4_gemv: {message}")):
        torch.ops._C.w4_gemv(**_meta(**overrides), rows_per_warp=rows_per_warp)
    torch.ops._C.w4_gemv(**_meta(), rows_per_warp=rows_per_warp if rows_per_warp in (1, 2, 4) else 1)


@pytest.mark.parametrize("tile,message", [((16, 32, 1), "'block_m' 16 needs 'block_n' 64 or 128"),
                                          ((8, 64, 1), "'block_m' must be 16, 32 or 64, got 8"),
                                          ((16, 256, 1), "'block_n' must be 32, 64 or 128, got 256"),
                                          ((16, 64, 0), "'splits' must be 1 to 64, got 0")])
def test_gemm_bad_tile_is_a_clear_error(tile, message):
    with pytest.raises(RuntimeError, match=re.escape(f"w4_gemm: {message}")):
        torch.ops._C.w4_gemm(**_meta(m=20), block_m=tile[0], block_n=tile[1], splits=tile[2])
    torch.ops._C.w4_gemm(**_meta(m=300), block_m=64, block_n=128, splits=3)


def test_dequantize_bad_out_is_a_clear_error():
    args = _meta()
    args.pop("input")
    torch.ops._C.w4_dequantize(**(args | {"out": torch.empty(64, 128, dtype=torch.float16, device="meta")}))
    with pytest.raises(RuntimeError, match=re.escape("w4_dequantize: 'out' must be a float16 tensor [64, 128]")):
        torch.ops._C.w4_dequantize(**args)


@pytest.mark.gpu
@requires_gpu
def test_w4_ops_opcheck():
    qweight, sz, _ = _weights(256, 40, 64)
    x = _x(5, 256).cuda()
    torch.library.opcheck(torch.ops._C.w4_gemv.default, (torch.empty(5, 40, dtype=torch.float16, device="cuda"),
                                                         x, qweight, sz, 2))
    torch.library.opcheck(torch.ops._C.w4_gemm.default, (torch.empty(5, 40, dtype=torch.float16, device="cuda"),
                                                         x, qweight, sz, 32, 32, 2))
    torch.library.opcheck(torch.ops._C.w4_dequantize.default,
                          (torch.empty(40, 256, dtype=torch.float16, device="cuda"), qweight, sz))
