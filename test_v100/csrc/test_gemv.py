"""gemv (decode matrix-vector product, float16), gemv_silu_and_mul (gate_up + silu_and_mul) and
gemv_add (a projection added into the residual) vs float64 references, the RMS-norm prologue of
gemv and gemv_silu_and_mul, CUDA-graph replay, and their argument checks (Meta kernels: run on
CPU too)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

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
@pytest.mark.parametrize("n,k", [(1, 8), (37, 520), (300, 1536), (90, 3584), (4096, 4096), (1000, 14336), (6, 2056)])
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


def _silu_and_mul_reference(x, w, b):
    """silu(gate) * up as gemv then silu_and_mul compute it: gate and up rounded to float16,
    silu rounded to float16, the product rounded once."""
    gate_up = _reference(x, w, b).half()
    n = w.shape[0] // 2
    gate, up = gate_up[:, :n].float(), gate_up[:, n:].float()
    return (F.silu(gate).half().float() * up).half()


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("n,k", [(1, 8), (37, 520), (1000, 4096), (7, 2056)])
@pytest.mark.parametrize("rows_per_block", [0, 2, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_silu_and_mul_matches_reference(device, m, n, k, rows_per_block, bias):
    # n output features not a multiple of the block's rows / 2; the weight holds 2n rows.
    x, w, b = _case(m, 2 * n, k, bias=bias, seed=3)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
    torch.ops._C.gemv_silu_and_mul(out, x, w, b, rows_per_block)
    # The gate and up sums may round to neighbouring float16 values: compare in float64 with
    # a tolerance of a few float16 ulps of the result.
    torch.testing.assert_close(out.double(), _silu_and_mul_reference(x, w, b).double(), atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_silu_and_mul_equals_gemv_then_silu_and_mul(device, m):
    # Same per-row summation order as gemv, the same roundings as silu_and_mul: bit-identical.
    x, w, b = _case(m, 2 * 1500, 4096, bias=True, seed=4)
    gate_up = torch.empty(m, 3000, dtype=torch.float16, device=device)
    torch.ops._C.gemv(gate_up, x, w, b, 4)
    expected = torch.empty(m, 1500, dtype=torch.float16, device=device)
    torch.ops._C.silu_and_mul(expected, gate_up)
    out = torch.empty(m, 1500, dtype=torch.float16, device=device)
    torch.ops._C.gemv_silu_and_mul(out, x, w, b, 4)
    assert torch.equal(out, expected)


def _gemv_then_add(device, m, n, k, rows_per_block, bias, seed):
    """A case for gemv_add: (x, w, b, residual, product, expected), where product is gemv's and
    expected = residual + product as fused_add_rms_norm adds them (what gemv_add must give)."""
    x, w, b = _case(m, n, k, bias=bias, seed=seed)
    residual = torch.randn(m, n, dtype=torch.float16, device=device)
    product = torch.empty(m, n, dtype=torch.float16, device=device)
    torch.ops._C.gemv(product, x, w, b, rows_per_block)
    return x, w, b, residual, product, (product.float() + residual.float()).half()


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("rows_per_block", [0, 2, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_add_matches_gemv_then_add(device, m, rows_per_block, bias):
    x, w, b, residual, product, expected = _gemv_then_add(device, m, 1001, 2048, rows_per_block, bias, seed=5)
    torch.testing.assert_close(product.double() + residual.double(), _reference(x, w, b) + residual.double(),
                               atol=2e-3, rtol=2e-3)
    torch.ops._C.gemv_add(residual, x, w, b, rows_per_block)
    assert torch.equal(residual, expected)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_add_rejects_an_output_that_overlaps_the_input(device):
    buf = torch.randn(1, 4096, dtype=torch.float16, device=device)
    w = torch.randn(2048, 2048, dtype=torch.float16, device=device)
    with pytest.raises(RuntimeError, match="gemv_add: 'out' must not overlap 'input'"):
        torch.ops._C.gemv_add(buf[:, 1024:3072], buf[:, :2048], w, None, 0)
    torch.ops._C.gemv_add(buf[:, 2048:], buf[:, :2048], w, None, 0)  # adjacent, not overlapping


def _rms_normed(x, g, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g.double()


def _norm_case(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(m, 1, generator=g) * 8 + 0.1  # rows of very different RMS
    x = (torch.randn(m, k, generator=g) * scale).half().cuda()
    weight = (torch.rand(k, generator=g) + 0.5).half().cuda()
    return x, weight


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(37, 520), (4096, 4096), (6, 2056)])
@pytest.mark.parametrize("rows_per_block", [0, 2, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_norm_prologue_matches_float64_reference(device, m, n, k, rows_per_block, bias):
    x, g = _norm_case(m, k, seed=6)
    _, w, b = _case(m, n, k, bias=bias, seed=7)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
    torch.ops._C.gemv(out, x, w, b, rows_per_block, g, 1e-5)
    y = _rms_normed(x, g, 1e-5) @ w.double().t()
    expected = y + b.double() if bias else y
    torch.testing.assert_close(out.double(), expected, atol=4e-3, rtol=4e-3)
    # rms_norm then gemv: the same up to rms_norm's float16 rounding of the normalized row.
    normed = torch.empty_like(x)
    torch.ops._C.rms_norm(normed, x, g, 1e-5)
    unfused = torch.empty_like(out)
    torch.ops._C.gemv(unfused, normed, w, b, rows_per_block)
    torch.testing.assert_close(out, unfused, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_silu_and_mul_norm_prologue_matches_reference(device, m, bias):
    x, g = _norm_case(m, 2056, seed=8)
    _, w, b = _case(m, 2 * 700, 2056, bias=bias, seed=9)
    out = torch.full((m, 700), float("nan"), dtype=torch.float16, device=device)
    torch.ops._C.gemv_silu_and_mul(out, x, w, b, 0, g, 1e-6)
    gate_up = (_rms_normed(x, g, 1e-6) @ w.double().t() + (b.double() if bias else 0)).half()
    expected = (F.silu(gate_up[:, :700].float()).half().float() * gate_up[:, 700:].float()).half()
    torch.testing.assert_close(out.double(), expected.double(), atol=4e-3, rtol=4e-3)


def _rope_case(m, heads, kv_heads, d, *, bias, norm, table_dtype, seed, k=None):
    k = k or heads * d
    n = (heads + 2 * kv_heads) * d
    x, w, b = _case(m, n, k, bias=bias, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    cache = torch.randn(2, 5, 16, kv_heads, d, generator=g).half().cuda()
    positions = torch.randint(0, 300, (m,), generator=g).cuda()
    positions[-1] = 400 if m > 2 else positions[-1]  # past the table (320 rows): not rotated
    slots = torch.randperm(80, generator=g)[:m].cuda()
    slots[0] = -1 if m > 1 else slots[0]  # a padding row: no cache write
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(320).float(), inv_freq)
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(table_dtype).cuda()
    norm_weight = (torch.rand(k, generator=g) + 0.5).half().cuda() if norm else None
    return x, w, b, cache, positions, slots, table, norm_weight


def _assert_rope_cache_equals_gemv_then_rotary(case, q_size, kv_size, d, neox):
    """gemv_rope_cache on a _rope_case equals gemv, then rotary_embedding_and_cache, bit for bit."""
    x, w, b, cache, positions, slots, table, g = case
    eps = 1e-6 if g is not None else 0.0
    expected = torch.empty(x.shape[0], w.shape[0], dtype=torch.float16, device=x.device)
    expected_cache = cache.clone()
    torch.ops._C.gemv(expected, x, w, b, 0, g, eps)
    q, k, v = expected.split([q_size, kv_size, kv_size], dim=1)
    torch.ops._C.rotary_embedding_and_cache(positions, q, k, v, expected_cache, slots, d, table, neox)
    out = torch.full_like(expected, float("nan"))
    torch.ops._C.gemv_rope_cache(out, x, w, b, positions, cache, slots, table, neox, g, eps)
    assert torch.equal(out, expected)
    assert torch.equal(cache, expected_cache)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 2, 64), (32, 8, 128)])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("bias,norm,table_dtype", [(False, False, torch.float32), (True, True, torch.float16),
                                                   (True, False, torch.float16), (False, True, torch.float32)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_rope_cache_equals_gemv_then_rotary_and_cache(device, m, heads, kv_heads, d, neox, bias, norm, table_dtype):
    case = _rope_case(m, heads, kv_heads, d, bias=bias, norm=norm, table_dtype=table_dtype, seed=10)
    _assert_rope_cache_equals_gemv_then_rotary(case, heads * d, kv_heads * d, d, neox)


def _groups_past_residency(device, rows_per_group):
    """Output rows for more row groups than twice the blocks the GPU can hold at once (at most 32
    per SM on every GPU from SM70 on; at K = 64 a block is one warp), plus a remainder: every
    block of a one-wave grid takes several groups, and the shares differ by one."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return rows_per_group * (2 * 32 * sms + 3)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("rows_per_block", [0, 2, 8])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_add_with_groups_past_residency_equals_gemv_then_add(device, m, rows_per_block):
    # Where launches are plain (not programmatic dependents: below SM90, Volta mode,
    # VLLM_VOLTA_PDL=0, 1-2 rows), gemv_add runs one wave of blocks that each take several row
    # groups; otherwise a block per group.
    n = _groups_past_residency(device, rows_per_block or 8) + 1  # automatic at K = 64: 8 rows
    x, w, b, residual, _, expected = _gemv_then_add(device, m, n, 64, rows_per_block, True, seed=6)
    torch.ops._C.gemv_add(residual, x, w, b, rows_per_block)
    assert torch.equal(residual, expected)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_rope_cache_with_groups_past_residency_equals_gemv_then_rotary_and_cache(device, m, norm):
    # The same one-wave grids for gemv_rope_cache (automatic at K = 64, a group: 4 rotation
    # pairs, 8 rows).
    d, kv_heads = 64, 2
    heads = _groups_past_residency(device, 8) // d + 1
    case = _rope_case(m, heads, kv_heads, d, bias=True, norm=norm, table_dtype=torch.float32, seed=11, k=64)
    _assert_rope_cache_equals_gemv_then_rotary(case, heads * d, kv_heads * d, d, True)


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


NORM_BAD_ARGS = [
    (dict(norm_weight=_meta(33)), "'norm_weight' must be contiguous and 1-D of size K = 32"),
    (dict(norm_weight=_meta((1, 32))), "'norm_weight' must be contiguous and 1-D of size K = 32"),
    (dict(norm_weight=_meta(32, torch.float32)), "'norm_weight' has dtype float32 but 'input' has float16"),
    (dict(norm_weight=_meta(32), epsilon=0.0), "'epsilon' must be > 0 with a norm_weight, got 0"),
]


@pytest.mark.parametrize("overrides,message", BAD_ARGS + NORM_BAD_ARGS)
def test_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"gemv: {message}")):
        torch.ops._C.gemv(**_meta_args(**overrides))


@pytest.mark.parametrize("overrides,message", NORM_BAD_ARGS)
def test_silu_and_mul_norm_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"gemv_silu_and_mul: {message}")):
        torch.ops._C.gemv_silu_and_mul(**_meta_args(out=_meta((2, 32)), **overrides))


def test_valid_meta_args_pass():
    torch.ops._C.gemv(**_meta_args())
    torch.ops._C.gemv(**_meta_args(bias=_meta(64), rows_per_block=8))
    torch.ops._C.gemv(**_meta_args(norm_weight=_meta(32), epsilon=1e-6))


GATED_BAD_ARGS = [
    (dict(weight=_meta((63, 32)), out=_meta((2, 31))), "'weight' must be [2N, K] (gate rows, then up rows), got 63 rows"),
    (dict(out=_meta((2, 64))), "'out' must be [M, N] = [2, 32]"),
    (dict(bias=_meta((32,))), "'bias' must be contiguous and 1-D of size 2N = 64"),
    (dict(input=_meta((5, 32)), out=_meta((5, 32))), "'input' must have 1 to 4 rows, got 5"),
]


@pytest.mark.parametrize("overrides,message", GATED_BAD_ARGS)
def test_silu_and_mul_bad_input_is_a_clear_error(overrides, message):
    args = _meta_args(out=_meta((2, 32)))
    args.update(overrides)
    with pytest.raises(RuntimeError, match=re.escape(f"gemv_silu_and_mul: {message}")):
        torch.ops._C.gemv_silu_and_mul(**args)


def test_silu_and_mul_valid_meta_args_pass():
    torch.ops._C.gemv_silu_and_mul(**_meta_args(out=_meta((2, 32)), bias=_meta(64)))


def _rope_meta_args(**overrides):
    args = dict(out=_meta((2, 8 * 16)), input=_meta((2, 32)), weight=_meta((8 * 16, 32)), bias=None,
                positions=_meta(2, torch.int64), kv_cache=_meta((2, 3, 16, 2, 16)), slot_mapping=_meta(2, torch.int64),
                cos_sin_cache=_meta((100, 16), torch.float32), is_neox=True)
    args.update(overrides)
    return args


ROPE_BAD_ARGS = [
    (dict(kv_cache=_meta((2, 3, 16, 2, 16), torch.float32)), "'kv_cache' has dtype float32 but 'input' has float16"),
    (dict(kv_cache=_meta((3, 16, 2, 16))), "'kv_cache' must be contiguous [2, num_blocks, block_size, num_kv_heads, head_size]"),
    (dict(kv_cache=_meta((2, 3, 16, 4, 16))), "'out' must hold query heads, then the key and value heads of 'kv_cache' "
                                              "(64 features each) of an even head_size 16, got 128 features"),
    (dict(positions=_meta(2, torch.int32)), "'positions' must be contiguous int64 [M] with M = 2"),
    (dict(slot_mapping=_meta(3, torch.int64)), "'slot_mapping' must be contiguous int64 [M] with M = 2"),
    (dict(cos_sin_cache=_meta((100, 8), torch.float32)), "'cos_sin_cache' must be [max_position, head_size = 16]"),
    (dict(cos_sin_cache=_meta((100, 16), torch.bfloat16)), "'cos_sin_cache' must be float32 or float16, got bfloat16"),
    (dict(out=_meta((2, 64))), "'out' must be [M, N] = [2, 128]"),
]


@pytest.mark.parametrize("overrides,message", ROPE_BAD_ARGS)
def test_rope_cache_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"gemv_rope_cache: {message}")):
        torch.ops._C.gemv_rope_cache(**_rope_meta_args(**overrides))


def test_rope_cache_valid_meta_args_pass():
    torch.ops._C.gemv_rope_cache(**_rope_meta_args())
    torch.ops._C.gemv_rope_cache(**_rope_meta_args(norm_weight=_meta(32), epsilon=1e-6,
                                                   cos_sin_cache=_meta((100, 16))))


def test_add_checks_its_arguments_as_gemv_does():
    torch.ops._C.gemv_add(**_meta_args())
    with pytest.raises(RuntimeError, match=re.escape("gemv_add: 'out' must be [M, N] = [2, 64]")):
        torch.ops._C.gemv_add(**_meta_args(out=_meta((2, 32))))
