"""gguf_gemv / gguf_dequantize (GGUF blocks decoded in registers, csrc/gguf_kernels.cu) against float64
references of the PyTorch dequantizer: every kept type, 1-8 input rows, odd N, K = 4096 and sizes
with a partial last step, outputs written into a column slice of a wider tensor (one launch per
part of a fused layer); gguf_dequantize bit for bit; gguf_linear's two paths (gemv up to 8 rows,
dequantize + cuBLAS above) over a layer of parts of different types. The argument checks (Meta
kernels) run without a GPU."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.quantization.gguf import gguf_linear
from vllm_volta.model_executor.layers.quantization.gguf_parts import Part, pack

from .gguf_cases import K_VALUES, TYPES, assert_close_to_reference, blocks, reference, weight64
from .op_cases import requires_gpu

_BUILT = hasattr(torch.ops._C, "gguf_gemv")
requires_op = pytest.mark.skipif(not _BUILT, reason="vllm_volta._C was built before gguf_gemv (rebuild it)")


def gpu(test):
    """Marked for the GPU run; skipped without CUDA or without the op in this build."""
    return pytest.mark.gpu(requires_gpu(requires_op(test)))


CASES = [(t, k) for t in TYPES for k in K_VALUES[t]]
IDS = [f"{t.name}-K{k}" for t, k in CASES]


@gpu
@pytest.mark.parametrize("qtype,k", CASES, ids=IDS)
def test_gemv_matches_float64(qtype, k):
    n = 1029  # odd: the last block of 4 warps holds one row
    w = blocks(qtype, n, k, seed=k + int(qtype)).cuda()
    gen = torch.Generator().manual_seed(1)
    bias = torch.randn(n, generator=gen).half().cuda()
    for m in range(1, 9):
        x = torch.randn(m, k, generator=gen).half().cuda()
        wide = torch.full((m, n + 24), float("nan"), dtype=torch.float16, device="cuda")
        out = wide[:, 8:8 + n]  # a column slice, as one part of a fused layer's output
        part_bias = bias if m % 2 else None
        ops.gguf_gemv(out, x, w, int(qtype), part_bias)
        torch.cuda.synchronize()
        assert_close_to_reference(out, reference(x, w, qtype, part_bias))
        assert wide[:, :8].isnan().all() and wide[:, 8 + n:].isnan().all()  # nothing outside the slice


@gpu
@pytest.mark.parametrize("qtype,k", CASES, ids=IDS)
def test_dequantize_is_exact(qtype, k):
    n = 67
    w = blocks(qtype, n, k, seed=3 + int(qtype)).cuda()
    out = torch.empty(n, k, dtype=torch.float16, device="cuda")
    ops.gguf_dequantize(out, w, int(qtype))
    assert torch.equal(out.cpu(), weight64(w, qtype, k).half())


@gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 40])
def test_gguf_linear_over_parts_of_different_types(m):
    """q, k (Q4_K) and v (Q6_K) rows, as a fused layer keeps them (one buffer, aligned parts)."""
    k = 512
    types = [(T.Q4_K, 256), (T.Q6_K, 128), (T.Q8_0, 72)]
    parts, row0 = [], 0
    for i, (qtype, rows) in enumerate(types):
        parts.append(Part(qtype, row0, rows, blocks(qtype, rows, k, seed=i).cuda()))
        row0 += rows
    w64 = torch.cat([weight64(p.blocks, p.qtype, k) for p in parts])
    pack(parts)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).half().cuda()
    bias = torch.randn(row0, generator=gen).half().cuda()
    out = gguf_linear(x.view(1, m, k), parts, row0, bias)
    assert out.shape == (1, m, row0)
    ref = x.cpu().double() @ w64.T + bias.cpu().double()
    if m > 8:  # cuBLAS on the float16 weight: its rounding too
        ref = (x.cpu().double() @ w64.half().double().T + bias.cpu().double())
    assert_close_to_reference(out[0], ref)


@requires_op
def test_argument_checks():
    meta = dict(device="meta")
    w = torch.empty(64, 144, dtype=torch.uint8, **meta)  # Q4_K, K = 256
    x = torch.empty(2, 256, dtype=torch.float16, **meta)
    out = torch.empty(2, 64, dtype=torch.float16, **meta)
    ops.gguf_gemv(out, x, w, int(T.Q4_K))
    with pytest.raises(RuntimeError, match="'qtype' must be a GGML type id among"):
        ops.gguf_gemv(out, x, w, int(T.Q4_1))
    with pytest.raises(RuntimeError, match=r"'weight' must be \[N, 176\]"):
        ops.gguf_gemv(out, x, w, int(T.Q5_K))
    with pytest.raises(RuntimeError, match="must have 1 to 8 rows"):
        ops.gguf_gemv(torch.empty(9, 64, dtype=torch.float16, **meta),
                      torch.empty(9, 256, dtype=torch.float16, **meta), w, int(T.Q4_K))
    with pytest.raises(RuntimeError, match="K \\(input features\\) must be a positive multiple of 256"):
        ops.gguf_gemv(out, torch.empty(2, 128, dtype=torch.float16, **meta), w, int(T.Q4_K))
    ops.gguf_dequantize(torch.empty(64, 256, dtype=torch.float16, **meta), w, int(T.Q4_K))
    with pytest.raises(RuntimeError, match="'out' must have the weight's 64 rows"):
        ops.gguf_dequantize(torch.empty(63, 256, dtype=torch.float16, **meta), w, int(T.Q4_K))


@gpu
def test_gguf_linear_copies_unaligned_rows_and_takes_empty_inputs():
    k, n = 256, 40
    parts = [Part(T.Q4_K, 0, n, blocks(T.Q4_K, n, k, seed=5).cuda())]
    pack(parts)
    base = torch.randn(2 * k + 8, generator=torch.Generator().manual_seed(0)).half().cuda()
    x = base[1:1 + 2 * k].view(2, k)  # 2-byte aligned rows
    out = gguf_linear(x, parts, n, None)
    assert_close_to_reference(out, reference(x, parts[0].blocks, T.Q4_K, None))
    assert gguf_linear(x[:0], parts, n, None).shape == (0, n)
