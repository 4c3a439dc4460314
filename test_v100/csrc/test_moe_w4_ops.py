"""The 4-bit MoE ops on a GPU against float64 references written from the layout's definition:
random packed experts (team widths 8 / 16 / 32 and one group per row), routings with experts that
get no token and with every pair on one expert, both activations; dequantization bit-equal to
the PyTorch one; Meta checks name the argument; opcheck. Skips without CUDA (the Meta checks
run wherever the extension has them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.quantization import moe_w4_layout as w4



def _has_kernel(key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("_C::moe_w4_dequantize", key)
    except RuntimeError:  # an extension built before these ops
        return False


cuda = pytest.mark.skipif(not torch.cuda.is_available() or not _has_kernel("CUDA"),
                          reason="needs a CUDA GPU and a build with the 4-bit MoE kernels")
has_meta = pytest.mark.skipif(not _has_kernel("Meta"), reason="extension built before the 4-bit MoE ops")


def _experts(e: int, n: int, k: int, group: int, gen: torch.Generator, device="cpu"):
    """(qweight [E, N, K/8], sz [E, N, G, 2], W float64 [E, N, K]) with W = (q - z) * s."""
    g = k // group
    q = torch.randint(0, 16, (e, n, k), generator=gen)
    z = torch.randint(0, 16, (e, n, g), generator=gen)
    s = (torch.rand(e, n, g, generator=gen) * 0.02 + 0.005).half()
    qweight = torch.stack([w4.pack_kmajor(q[i].t()) for i in range(e)])
    sz = torch.stack((s, z.half()), dim=-1)
    dense = (q - z.repeat_interleave(group, -1)).double() * s.double().repeat_interleave(group, -1)
    return qweight.to(device), sz.to(device), dense


def _routing(kind: str, tokens: int, top_k: int, experts: int, gen: torch.Generator):
    if kind == "one":  # every pair on expert 1 (k = 1 then; with k > 1 the rest on expert 0)
        ids = torch.zeros(tokens, top_k, dtype=torch.int32)
        ids[:, 0] = 1
    else:  # distinct experts per token from the first half only: the others get no token
        ids = torch.stack([torch.randperm(max(top_k, experts // 2), generator=gen)[:top_k]
                           for _ in range(tokens)]).int()
    weights = torch.rand(tokens, top_k, generator=gen)
    return ids, weights / weights.sum(1, keepdim=True)


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float = 5e-3) -> None:
    """Within float16 noise of the whole output's scale (half2 products, half roundings)."""
    err = (got - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item() + 1e-3, f"max error {err} vs scale {ref.abs().max().item()}"


SHAPES = [(64, 64, 32), (512, 768, 128), (2048, 768, 128), (256, 96, -1)]  # (H, I, group)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("hidden,inter,group", SHAPES)
@pytest.mark.parametrize("routing", ["spread", "one"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_gemvs_match_float64(hidden, inter, group, routing, activation, tokens):
    gen = torch.Generator().manual_seed(hidden + inter + tokens)
    experts, top_k = 8, 4
    q13, sz13, w13 = _experts(experts, 2 * inter, hidden, hidden if group == -1 else group, gen, "cuda")
    q2, sz2, w2 = _experts(experts, hidden, inter, inter if group == -1 else group, gen, "cuda")
    ids, weights = _routing(routing, tokens, top_k, experts, gen)
    x = torch.randn(tokens, hidden, generator=gen).half()
    act = torch.empty(tokens, top_k, inter, dtype=torch.half, device="cuda")
    ops.moe_w4_gemv_act_and_mul(act, x.cuda(), q13, sz13, ids.cuda(), 0 if activation == "silu" else 1)
    fn = F.silu if activation == "silu" else (lambda v: F.gelu(v, approximate="tanh"))
    ref_act = torch.empty(tokens, top_k, inter, dtype=torch.float64)
    for t in range(tokens):
        for j in range(top_k):
            gu = w13[ids[t, j]] @ x[t].double()
            ref_act[t, j] = fn(gu[:inter]) * gu[inter:]
    _close(act.double().cpu(), ref_act)
    out = torch.empty(tokens, hidden, dtype=torch.half, device="cuda")
    ops.moe_w4_gemv_down_sum(out, act, q2, sz2, ids.cuda(), weights.cuda())
    ref = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(top_k):
            ref[t] += weights[t, j].double() * (w2[ids[t, j]] @ act[t, j].double().cpu())
    _close(out.double().cpu(), ref)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("hidden,inter,group", SHAPES)
def test_dequantize_is_the_pytorch_dequantization(hidden, inter, group):
    gen = torch.Generator().manual_seed(7)
    qweight, sz, _ = _experts(6, 2 * inter, hidden, hidden if group == -1 else group, gen, "cuda")
    experts = torch.tensor([5, 0, 5, 2], dtype=torch.int32, device="cuda")  # repeats allowed
    out = torch.empty(4, 2 * inter, hidden, dtype=torch.half, device="cuda")
    ops.moe_w4_dequantize(out, qweight, sz, experts)
    ref = w4.dequantize(qweight[experts.long()], sz[experts.long()], torch.float16)
    assert torch.equal(out, ref)


@cuda
@pytest.mark.gpu
def test_opcheck():
    gen = torch.Generator().manual_seed(1)
    q13, sz13, _ = _experts(4, 64, 64, 32, gen, "cuda")
    q2, sz2, _ = _experts(4, 64, 32, 32, gen, "cuda")
    ids = torch.tensor([[0, 3], [2, 2]], dtype=torch.int32, device="cuda")
    x = torch.randn(2, 64, device="cuda").half()
    act = torch.empty(2, 2, 32, dtype=torch.half, device="cuda")
    torch.library.opcheck(torch.ops._C.moe_w4_gemv_act_and_mul.default, (act, x, q13, sz13, ids, 0))
    out = torch.empty(2, 64, dtype=torch.half, device="cuda")
    w = torch.full((2, 2), 0.5, device="cuda")
    torch.library.opcheck(torch.ops._C.moe_w4_gemv_down_sum.default, (out, act, q2, sz2, ids, w))
    deq = torch.empty(1, 64, 64, dtype=torch.half, device="cuda")
    torch.library.opcheck(torch.ops._C.moe_w4_dequantize.default, (deq, q13, sz13, ids[0]))


@has_meta
def test_meta_checks_name_the_argument():
    m = dict(device="meta")
    q = torch.empty(4, 64, 8, dtype=torch.int32, **m)
    sz = torch.empty(4, 64, 2, 2, dtype=torch.half, **m)
    ids = torch.empty(2, 2, dtype=torch.int32, **m)
    x = torch.empty(2, 64, dtype=torch.half, **m)
    act = torch.empty(2, 2, 32, dtype=torch.half, **m)
    torch.ops._C.moe_w4_gemv_act_and_mul(act, x, q, sz, ids, 0)
    with pytest.raises(RuntimeError, match="'activation' must be 0 \\(silu\\) or 1"):
        torch.ops._C.moe_w4_gemv_act_and_mul(act, x, q, sz, ids, 2)
    with pytest.raises(RuntimeError, match="'input' must be float16"):
        torch.ops._C.moe_w4_gemv_act_and_mul(act, x.float(), q, sz, ids, 0)
    with pytest.raises(RuntimeError, match="group size"):
        torch.ops._C.moe_w4_dequantize(torch.empty(1, 64, 64, dtype=torch.half, **m), q,
                                       torch.empty(4, 64, 3, 2, dtype=torch.half, **m), ids[0])
    with pytest.raises(RuntimeError, match="'out' must be \\[num_tokens, top_k, intermediate\\]"):
        torch.ops._C.moe_w4_gemv_act_and_mul(act[:, :1].contiguous(), x, q, sz, ids, 0)
