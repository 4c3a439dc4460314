"""Quantized MoE experts (AWQ, GPTQ, compressed-tensors 4-bit; FP8 block / tensor / channel) on the
layer's PyTorch path against the dequantized weights' MoE in float64, alone, split over two
tensor-parallel ranks and over two expert-parallel ranks; bad inputs are clear errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from test_v100.model_executor.layers.quantization import moe_checkpoints as ckpt
from vllm_volta.model_executor.layers.expert_parallel import expert_parallel
from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization

E, TOP_K, H, I = 6, 2, 64, 64
W4 = [("awq", 32, False), ("gptq", 32, False), ("gptq_v2", 32, False), ("gptq", -1, False),
      ("compressed-tensors", 32, False), ("compressed-tensors", 32, True), ("compressed-tensors", -1, True)]
FP8 = ["block", "tensor", "channel"]


def _checkpoint(kind: str, fmt, group=32, sym=False, seed=0):
    """(quantization_config, router [E, H], per expert {part: tensors}, dense {part: [E, N, K]})."""
    gen = torch.Generator().manual_seed(seed)
    router = torch.randn(E, H, generator=gen)
    shapes = {"gate": (I, H), "up": (I, H), "down": (H, I)}
    tensors = [dict() for _ in range(E)]
    dense = {part: torch.empty(E, *shape, dtype=torch.float64) for part, shape in shapes.items()}
    for e in range(E):
        for part, (n, k) in shapes.items():
            w = torch.randn(n, k, generator=gen) * 0.2
            if kind == "w4":
                q, z, s, dense[part][e] = ckpt.quantize_w4(w, group, sym)
                tensors[e][part] = ckpt.w4_tensors(fmt, q, z, s, sym)
            else:
                tensors[e][part], dense[part][e] = ckpt.quantize_fp8(w, fmt)
    qc = ckpt.w4_config(fmt, group, sym) if kind == "w4" else ckpt.fp8_config(fmt)
    return get_quant_config(SimpleNamespace(quantization_config=qc)), router, tensors, dense


def _reference(x, router, dense, renormalize=True):
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t, row in enumerate(x.double()):
        weights, ids = torch.softmax(router.double() @ row, 0).topk(TOP_K)
        if renormalize:
            weights = weights / weights.sum()
        for w, e in zip(weights, ids):
            h = F.silu(dense["gate"][e] @ row) * (dense["up"][e] @ row)
            out[t] += w * (dense["down"][e] @ h)
    return out


def _build(config, router, tensors):
    with quantization(config):
        moe = MoE(E, TOP_K, H, I, renormalize=True)
    assert moe.gate.quant_method is None  # the router stays dense
    moe.gate.weight.data.copy_(router)
    for e in range(E):
        for part, named in tensors[e].items():
            for suffix, t in named.items():
                moe.load_expert(e, part, t, suffix)
    return moe


def _cases():
    return [pytest.param("w4", *c, id=f"{c[0]}-g{c[1]}{'-sym' if c[2] else ''}") for c in W4] + \
           [pytest.param("fp8", s, 32, False, id=f"fp8-{s}") for s in FP8]


@pytest.mark.parametrize("kind,fmt,group,sym", _cases())
def test_matches_dequantized_reference(kind, fmt, group, sym):
    config, router, tensors, dense = _checkpoint(kind, fmt, group, sym)
    moe = _build(config, router, tensors)
    assert moe.quant_method.kind == kind and not hasattr(moe, "w13")
    gen = torch.Generator().manual_seed(3)
    for tokens in (1, 3, 17):  # some experts get no token at small counts
        x = torch.randn(tokens, H, generator=gen)
        torch.testing.assert_close(moe(x).double(), _reference(x, router, dense), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind,fmt,group,sym", [pytest.param("w4", "awq", 32, False, id="awq"),
                                                pytest.param("w4", "compressed-tensors", -1, True, id="ct-channel"),
                                                pytest.param("fp8", "block", 32, False, id="fp8-block"),
                                                pytest.param("fp8", "tensor", 32, False, id="fp8-tensor")])
@pytest.mark.parametrize("ep", [False, True])
def test_two_ranks_sum_to_the_whole(set_tp, monkeypatch, kind, fmt, group, sym, ep):
    config, router, tensors, dense = _checkpoint(kind, fmt, group, sym, seed=1)
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr("vllm_volta.model_executor.layers.moe.tensor_model_parallel_all_reduce", lambda t: t)
    parts = []
    for rank in range(2):
        set_tp(rank, 2)
        with expert_parallel(ep):
            moe = _build(config, router, tensors)
        assert moe.num_local_experts == (E // 2 if ep else E) and moe.intermediate == (I if ep else I // 2)
        parts.append(moe(x))
    torch.testing.assert_close((parts[0] + parts[1]).double(), _reference(x, router, dense), atol=1e-4, rtol=1e-4)


def test_bad_inputs():
    config, router, tensors, _ = _checkpoint("w4", "awq")
    moe = _build(config, router, tensors)
    with pytest.raises(ValueError, match="'weight_packed' is not part of a awq checkpoint"):
        moe.load_expert(0, "gate", tensors[0]["gate"]["qweight"], "weight_packed")
    with pytest.raises(ValueError, match="128 outputs, expected 64"):
        moe.load_expert(0, "gate", torch.cat([tensors[0]["gate"]["scales"]] * 2, 1), "scales")
    with quantization(config), pytest.raises(ValueError, match="group_size: the experts' intermediate size"):
        MoE(E, TOP_K, H, 48, renormalize=True)  # 48 inputs per rank: not a multiple of 32
    act_order = get_quant_config(SimpleNamespace(quantization_config={
        "quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True}))
    with quantization(act_order), pytest.raises(ValueError, match="activation order"):
        MoE(E, TOP_K, H, I, renormalize=True)
    eight = get_quant_config(SimpleNamespace(quantization_config={"quant_method": "gptq", "bits": 8, "group_size": 32}))
    with quantization(eight), pytest.raises(ValueError, match="bits: 8-bit mixture-of-experts"):
        MoE(E, TOP_K, H, I, renormalize=True)
    dense = MoE(E, TOP_K, H, I, renormalize=True)
    with pytest.raises(ValueError, match="without a quantization_config"):
        dense.load_expert(0, "gate", torch.zeros(I, H), "qweight")


def test_shared_expert_blocks_keep_their_gates_float():
    """Qwen2-MoE / Qwen3-Next / Qwen3.5: the routed experts and the shared expert's MLP are
    quantized, the router and the one-output shared_expert_gate stay float (as checkpoints ship)."""
    from vllm_volta.model_executor.models import qwen2_moe, qwen3_next

    config = get_quant_config(SimpleNamespace(quantization_config=ckpt.w4_config("awq", 32)))
    hf = SimpleNamespace(num_experts=E, num_experts_per_tok=TOP_K, hidden_size=H, moe_intermediate_size=I,
                         norm_topk_prob=True, hidden_act="silu", shared_expert_intermediate_size=64)
    with quantization(config):
        blocks = [qwen2_moe.SharedExpertMoE(hf), qwen3_next.SharedExpertMoE(hf, renormalize=True)]
    for moe in blocks:
        assert moe.quant_method.kind == "w4" and moe.shared_expert.gate_up_proj.quant_method is not None
        assert moe.gate.quant_method is None and moe.shared_expert_gate.quant_method is None
