"""The mixture-of-experts ops against plain-PyTorch references: topk_softmax / topk_sigmoid,
moe_align_block_size, moe_sum, the decode GEMVs (moe_gemv_silu_and_mul, moe_gemv_down_sum) and
the tensor-core grouped GEMM, in float64 / float32 references with awkward sizes, plus CUDA-graph
replay; argument checks through the Meta kernels (run on CPU too)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.moe_routing import align_reference, max_padded_pairs, topk_reference

from .op_cases import requires_gpu, skip_unsupported

gpu = [pytest.mark.gpu, requires_gpu]
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=2.5e-2, rtol=2.5e-2)}


def _topk(op, logits, k):
    t = logits.shape[0]
    w = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, k, dtype=torch.int32, device=logits.device)
    tei = torch.empty_like(ids)
    getattr(torch.ops._C, op)(w, ids, tei, logits)
    return w, ids, tei


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts,k", [(1, 8, 2), (7, 60, 4), (33, 128, 8), (5, 257, 1), (3, 1024, 32)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_topk_matches_torch(device, scoring, dtype, tokens, experts, k):
    skip_unsupported(device, dtype)
    g = torch.Generator().manual_seed(tokens + experts)
    logits = (torch.randn(tokens, experts, generator=g) * 3).to(dtype).to(device)
    w, ids, tei = _topk(f"topk_{scoring}", logits, k)
    ref_w, ref_ids = topk_reference(logits.cpu(), k, scoring)
    torch.testing.assert_close(w.cpu(), ref_w, atol=1e-6, rtol=1e-5)
    # Equal scores may pick either expert: compare the chosen experts' scores, not just ids.
    scores = torch.softmax(logits.float().cpu(), -1) if scoring == "softmax" else torch.sigmoid(logits.float().cpu())
    torch.testing.assert_close(scores.gather(1, ids.long().cpu()), ref_w, atol=1e-6, rtol=1e-5)
    if dtype == torch.float32:  # half-precision logits tie often; ties may pick either expert
        assert (ids.cpu() == ref_ids).float().mean() > 0.95
    assert all(len(set(row.tolist())) == k for row in ids.cpu())
    expected_tei = torch.arange(k)[None, :] * tokens + torch.arange(tokens)[:, None]
    assert torch.equal(tei.cpu(), expected_tei.int())


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_topk_of_nan_rows_stays_in_range(device):
    # A CUDA graph's padded rows may hold anything: they must still route to valid experts.
    logits = torch.randn(4, 16, device=device)
    logits[1] = float("nan")
    logits[2, ::2] = float("nan")
    w, ids, _ = _topk("topk_softmax", logits, 4)
    assert ((ids >= 0) & (ids < 16)).all()
    assert all(len(set(row.tolist())) == 4 for row in ids.cpu())
    ref_w, _ = topk_reference(logits[3:].cpu(), 4)
    torch.testing.assert_close(w[3:].cpu(), ref_w)


def _align(ids, experts, block):
    pairs = ids.numel()
    length = max_padded_pairs(pairs, experts, block)
    sorted_ids = torch.full((length,), -7, dtype=torch.int32, device=ids.device)
    experts_ids = torch.full((-(-length // block),), -7, dtype=torch.int32, device=ids.device)
    total = torch.empty(1, dtype=torch.int32, device=ids.device)
    torch.ops._C.moe_align_block_size(ids, experts, block, sorted_ids, experts_ids, total)
    return sorted_ids, experts_ids, total


@pytest.mark.parametrize("tokens,experts,k,block", [(1, 8, 2, 16), (5, 60, 4, 16), (37, 128, 8, 64),
                                                     (300, 8, 2, 32), (2048, 128, 8, 64), (3, 1024, 1, 1)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_align_block_size_matches_reference(device, tokens, experts, k, block):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]).int()
    sorted_ids, experts_ids, total = _align(ids.to(device), experts, block)
    ref_sorted, ref_experts, ref_total = align_reference(ids, experts, block)
    assert torch.equal(total.cpu(), ref_total) and torch.equal(experts_ids.cpu(), ref_experts)
    # Within an expert the kernel's order is free (its pairs may move between the expert's
    # blocks): compare each expert's padded run as a set.
    runs: dict[int, tuple[int, int]] = {}
    for b, e in enumerate(ref_experts.tolist()[:int(ref_total) // block]):
        lo, _ = runs.get(e, (b * block, 0))
        runs[e] = (lo, (b + 1) * block)
    for lo, hi in runs.values():
        assert sorted(sorted_ids[lo:hi].tolist()) == sorted(ref_sorted[lo:hi].tolist())
    assert (sorted_ids[int(ref_total):].cpu() == ids.numel()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_moe_sum(device, dtype):
    skip_unsupported(device, dtype)
    x = torch.randn(9, 3, 1100, device=device).to(dtype)
    out = torch.empty(9, 1100, dtype=dtype, device=device)
    torch.ops._C.moe_sum(x, out)
    torch.testing.assert_close(out.float(), x.float().sum(1), **TOL[dtype])


def _experts(e, hidden, inter, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(dtype).to(device)
    w2 = (torch.randn(e, hidden, inter, generator=g) / inter ** 0.5).to(dtype).to(device)
    return w13, w2


def _routing(tokens, e, k, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)]).int().to(device)
    w = torch.rand(tokens, k, generator=g).to(device)
    return ids, w


def _pairs_matmul(rows, w, experts):
    """float64 [P, N]: rows[p] @ w[experts[p]]^T, one matmul per used expert (no [P, N, K] gather)."""
    out = torch.zeros(rows.shape[0], w.shape[1], dtype=torch.float64, device=rows.device)
    for e in experts.unique().tolist():
        sel = experts == e
        out[sel] = rows[sel].double() @ w[e].double().t()
    return out


def _reference_act(x, w13, ids, activation="silu"):
    """[T, k, I] float64: act(gate) * up of each chosen expert."""
    tokens, k = ids.shape
    inter = w13.shape[1] // 2
    h = _pairs_matmul(x.repeat_interleave(k, 0), w13, ids.flatten()).view(tokens, k, -1)
    act = F.silu if activation == "silu" else lambda g: F.gelu(g, approximate="tanh")
    return act(h[..., :inter]) * h[..., inter:]


def _reference_down(act, w2, ids, w):
    tokens, k = ids.shape
    y = _pairs_matmul(act.reshape(tokens * k, -1), w2, ids.flatten()).view(tokens, k, -1)
    return (y * w.double()[..., None]).sum(1)


SHAPES = [(5, 72, 40, 2), (8, 256, 1032, 2), (128, 2048, 768, 8), (3, 16, 8, 3)]


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows_per_block", [0, 2, 4, 8])
@pytest.mark.parametrize("tokens", [1, 3, 8])
@pytest.mark.parametrize("e,hidden,inter,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_decode_gemvs_match_float64(device, dtype, e, hidden, inter, k, tokens, rows_per_block, activation):
    skip_unsupported(device, dtype)
    w13, w2 = _experts(e, hidden, inter, dtype, device)
    ids, w = _routing(tokens, e, k, device)
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    act = torch.full((tokens, k, inter), float("nan"), dtype=dtype, device=device)
    getattr(torch.ops._C, f"moe_gemv_{activation}_and_mul")(act, x, w13, ids, rows_per_block)
    torch.testing.assert_close(act.double(), _reference_act(x, w13, ids, activation), **TOL[dtype])
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype, device=device)
    torch.ops._C.moe_gemv_down_sum(out, act, w2, ids, w, rows_per_block)
    torch.testing.assert_close(out.double(), _reference_down(act, w2, ids, w), **TOL[dtype])


def _grouped(x, w13, w2, ids, w, block):
    """The prefill pipeline of fused_moe.py, op by op."""
    tokens, k = ids.shape
    inter, e = w2.shape[2], w13.shape[0]
    sorted_ids, experts_ids, total = _align(ids, e, block)
    gate_up = torch.full((tokens * k, 2 * inter), float("nan"), dtype=x.dtype, device=x.device)
    torch.ops._C.moe_grouped_gemm(gate_up, x, w13, sorted_ids, experts_ids, total, None, k, block)
    return gate_up, sorted_ids, experts_ids, total


@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("tokens", [1, 9, 100, 513])
@pytest.mark.parametrize("e,hidden,inter,k", SHAPES[:3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_grouped_gemm_matches_float64(device, dtype, e, hidden, inter, k, tokens, block):
    skip_unsupported(device, dtype)
    w13, w2 = _experts(e, hidden, inter, dtype, device, seed=1)
    ids, w = _routing(tokens, e, k, device, seed=2)
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    gate_up, sorted_ids, experts_ids, total = _grouped(x, w13, w2, ids, w, block)
    expected = _pairs_matmul(x.repeat_interleave(k, 0), w13, ids.flatten())
    torch.testing.assert_close(gate_up.double(), expected, **TOL[dtype])
    # Second GEMM: one input row per pair (top_k = 1), scaled by the pair's routing weight.
    act = torch.randn(tokens * k, inter, device=device).to(dtype)
    down = torch.full((tokens * k, hidden), float("nan"), dtype=dtype, device=device)
    torch.ops._C.moe_grouped_gemm(down, act, w2, sorted_ids, experts_ids, total, w, 1, block)
    ref = _pairs_matmul(act, w2, ids.flatten()) * w.flatten().double()[:, None]
    torch.testing.assert_close(down.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_decode_and_grouped_paths_replay_in_a_cuda_graph(device):
    from vllm_volta.model_executor.layers.fused_moe import fused_experts
    e, hidden, inter, k, tokens = 16, 256, 128, 4, 24
    w13, w2 = _experts(e, hidden, inter, torch.float16, device, seed=3)
    x = torch.zeros(tokens, hidden, dtype=torch.float16, device=device)
    ids = torch.zeros(tokens, k, dtype=torch.int32, device=device)
    w = torch.zeros(tokens, k, device=device)
    for config in ({"path": "gemv", "rows_per_block": 0}, {"path": "gemm", "block_size": 16}):
        fused_experts(x, w13, w2, w, ids, config)  # warm up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_experts(x, w13, w2, w, ids, config)
        for seed in (4, 5):
            new_ids, new_w = _routing(tokens, e, k, device, seed=seed)
            x.copy_(torch.randn(tokens, hidden, device=device).half())
            ids.copy_(new_ids)
            w.copy_(new_w)
            graph.replay()
            ref = _reference_down(_reference_act(x, w13, ids).half(), w2, ids, w)
            torch.testing.assert_close(out.double(), ref, **TOL[torch.float16])


def _meta(shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_routing_bad_input_is_a_clear_error():
    w, ids, tei = _meta((4, 2), torch.float32), _meta((4, 2), torch.int32), _meta((4, 2), torch.int32)
    with pytest.raises(RuntimeError, match=re.escape("topk_softmax: 'topk_ids' must be int32")):
        torch.ops._C.topk_softmax(w, _meta((4, 2), torch.int64), tei, _meta((4, 8)))
    with pytest.raises(RuntimeError,
                       match=re.escape("topk_softmax: top_k must be in [1, min(num_experts, 32)], got 2")):
        torch.ops._C.topk_softmax(w, ids, tei, _meta((4, 1)))
    with pytest.raises(RuntimeError, match=re.escape("topk_sigmoid: 'topk_weights' must be [num_tokens, top_k]")):
        torch.ops._C.topk_sigmoid(_meta((3, 2), torch.float32), ids, tei, _meta((4, 8)))
    torch.ops._C.topk_softmax(w, ids, tei, _meta((4, 8), torch.bfloat16))  # valid


def test_align_and_sum_bad_input_is_a_clear_error():
    i32 = torch.int32
    ids = _meta((4, 2), i32)
    with pytest.raises(RuntimeError, match=re.escape("moe_align_block_size: 'block_size' must be in [1, 256], got 0")):
        torch.ops._C.moe_align_block_size(ids, 8, 0, _meta(100, i32), _meta(100, i32), _meta(1, i32))
    with pytest.raises(RuntimeError, match=re.escape("'sorted_token_ids' must be 1-D with at least")):
        torch.ops._C.moe_align_block_size(ids, 8, 16, _meta(100, i32), _meta(100, i32), _meta(1, i32))
    torch.ops._C.moe_align_block_size(ids, 8, 16, _meta(128, i32), _meta(8, i32), _meta(1, i32))  # valid
    with pytest.raises(RuntimeError, match=re.escape("moe_sum: 'input' must be [num_tokens, top_k, hidden]")):
        torch.ops._C.moe_sum(_meta((4, 2, 8)), _meta((4, 9)))


def test_expert_gemv_and_gemm_bad_input_is_a_clear_error():
    i32, f32 = torch.int32, torch.float32
    ids = _meta((2, 2), i32)
    with pytest.raises(RuntimeError, match=re.escape("moe_gemv_silu_and_mul: 'out' must be [num_tokens, top_k, "
                                                     "intermediate] = [2, 2, 16]")):
        torch.ops._C.moe_gemv_silu_and_mul(_meta((2, 2, 8)), _meta((2, 64)), _meta((4, 32, 64)), ids, 0)
    with pytest.raises(RuntimeError, match=re.escape("moe_gemv_gelu_tanh_and_mul: 'out' must be [num_tokens, "
                                                     "top_k, intermediate] = [2, 2, 16]")):
        torch.ops._C.moe_gemv_gelu_tanh_and_mul(_meta((2, 2, 8)), _meta((2, 64)), _meta((4, 32, 64)), ids, 0)
    with pytest.raises(RuntimeError, match=re.escape("moe_gemv_silu_and_mul: in_features must be a positive "
                                                     "multiple of 8 (16-byte vectors), got 12")):
        torch.ops._C.moe_gemv_silu_and_mul(_meta((2, 2, 16)), _meta((2, 12)), _meta((4, 32, 12)), ids, 0)
    with pytest.raises(RuntimeError, match=re.escape("moe_gemv_down_sum: 'rows_per_block' must be 0 (automatic), "
                                                     "2, 4 or 8, got 3")):
        torch.ops._C.moe_gemv_down_sum(_meta((2, 64)), _meta((2, 2, 16)), _meta((4, 64, 16)), ids,
                                       _meta((2, 2), f32), 3)
    with pytest.raises(RuntimeError, match=re.escape("moe_gemv_down_sum: 'topk_weights' must be float32")):
        torch.ops._C.moe_gemv_down_sum(_meta((2, 64)), _meta((2, 2, 16)), _meta((4, 64, 16)), ids, _meta((2, 2)), 0)
    torch.ops._C.moe_gemv_down_sum(_meta((2, 64)), _meta((2, 2, 16)), _meta((4, 64, 16)), ids,
                                   _meta((2, 2), f32), 0)  # valid
    gemm = dict(out=_meta((4, 32)), input=_meta((2, 64)), weight=_meta((4, 32, 64)), sorted_token_ids=_meta(64, i32),
                experts_ids=_meta(4, i32), num_tokens_post_pad=_meta(1, i32), topk_weights=None, top_k=2,
                block_size=16)
    torch.ops._C.moe_grouped_gemm(**gemm)  # valid
    with pytest.raises(RuntimeError, match=re.escape("moe_grouped_gemm: 'block_size' must be 16, 32 or 64, got 8")):
        torch.ops._C.moe_grouped_gemm(**{**gemm, "block_size": 8})
    with pytest.raises(RuntimeError, match=re.escape("moe_grouped_gemm: 'input' must be float16 or bfloat16")):
        torch.ops._C.moe_grouped_gemm(**{**gemm, "input": _meta((2, 64), f32)})
    with pytest.raises(RuntimeError, match=re.escape("moe_grouped_gemm: 'out' must be [4, 32]")):
        torch.ops._C.moe_grouped_gemm(**{**gemm, "out": _meta((2, 32))})


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_ops_opcheck(device):
    e, hidden, inter, k, tokens = 8, 64, 32, 2, 5
    w13, w2 = _experts(e, hidden, inter, torch.float16, device)
    ids, w = _routing(tokens, e, k, device)
    x = torch.randn(tokens, hidden, device=device).half()
    logits = torch.randn(tokens, e, device=device)
    topk_out = (torch.empty(tokens, k, device=device), torch.empty(tokens, k, dtype=torch.int32, device=device),
                torch.empty(tokens, k, dtype=torch.int32, device=device))
    torch.library.opcheck(torch.ops._C.topk_softmax.default, (*topk_out, logits))
    torch.library.opcheck(torch.ops._C.topk_sigmoid.default, (*topk_out, logits))
    act = torch.empty(tokens, k, inter, dtype=torch.float16, device=device)
    torch.library.opcheck(torch.ops._C.moe_gemv_silu_and_mul.default, (act, x, w13, ids, 0))
    torch.library.opcheck(torch.ops._C.moe_gemv_gelu_tanh_and_mul.default, (act, x, w13, ids, 0))
    out = torch.empty(tokens, hidden, dtype=torch.float16, device=device)
    torch.library.opcheck(torch.ops._C.moe_gemv_down_sum.default, (out, act, w2, ids, w, 0))
    torch.library.opcheck(torch.ops._C.moe_sum.default, (torch.randn(tokens, k, hidden, device=device).half(), out))
    sorted_ids, experts_ids, total = _align(ids, e, 16)
    # The order within an expert may differ between calls: only the schema and the Meta kernel.
    torch.library.opcheck(torch.ops._C.moe_align_block_size.default,
                          (ids, e, 16, sorted_ids.clone(), experts_ids.clone(), total.clone()),
                          test_utils=("test_schema", "test_faketensor"))
    gate_up = torch.empty(tokens * k, 2 * inter, dtype=torch.float16, device=device)
    torch.library.opcheck(torch.ops._C.moe_grouped_gemm.default,
                          (gate_up, x, w13, sorted_ids, experts_ids, total, None, k, 16))
