"""Gated DeltaNet: the PyTorch ops against definitions (a float64 token-by-token recurrence, a
plain conv over the whole history, transformers' gated norm) and the layer against transformers'
Qwen3.5 / Qwen3-Next layers over varlen batches that continue from saved state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_next import modeling_qwen3_next

from vllm_volta.attention.metadata import build_attn_metadata
from vllm_volta.core.kv_cache_spec import MambaSpec
from vllm_volta.model_executor.layers import fla_ops
from vllm_volta.model_executor.layers.gated_delta_net import GatedDeltaNet, ssm_state_dtype
from vllm_volta.model_executor.layers.quantization import quantization
from vllm_volta.model_executor.layers.quantization.awq import AWQConfig
from vllm_volta.model_executor.models.utils import default_dtype

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _recurrence64(q, k, v, g, beta, state):
    """The gated delta rule token by token in float64, written from its definition."""
    state = state.double().clone()
    out = []
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = state[h] * torch.exp(g[t, h].double())
            u = beta[t, h].double() * (v[t, h].double() - s.t() @ k[t, h].double())
            state[h] = s + torch.outer(k[t, h].double(), u)
        out.append(torch.einsum("hk,hkv->hv", q[t].double(), state))
    return torch.stack(out), state


def _inputs(length, heads=3, dk=16, dv=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = fla_ops.l2_normalize(torch.randn(length, heads, dk, generator=gen)) * dk ** -0.5
    k = fla_ops.l2_normalize(torch.randn(length, heads, dk, generator=gen))
    v = torch.randn(length, heads, dv, generator=gen)
    g = -torch.rand(length, heads, generator=gen) * 3  # decays from 1 down to e^-3
    beta = torch.rand(length, heads, generator=gen)
    return q, k, v, g, beta, torch.randn(heads, dk, dv, generator=gen)


# (300, 8): 38 chunks, more than one group of chunks built at once
@pytest.mark.parametrize("length,chunk_size", [(1, 64), (63, 64), (64, 64), (65, 64), (150, 64), (37, 8), (300, 8)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_delta_rule_equals_the_recurrence(length, chunk_size, with_state):
    q, k, v, g, beta, state = _inputs(length)
    out, final = fla_ops.chunk_gated_delta_rule(q, k, v, g, beta, state if with_state else None, chunk_size)
    ref_out, ref_final = _recurrence64(q, k, v, g, beta, state if with_state else torch.zeros_like(state))
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(final.double(), ref_final, atol=2e-5, rtol=1e-5)


def test_decode_step_equals_the_recurrence():
    q, k, v, g, beta, state = _inputs(1, seed=1)
    out, final = fla_ops.gated_delta_rule_step(q, k, v, g, beta, state[None])
    ref_out, ref_final = _recurrence64(q, k, v, g, beta, state)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final[0].double(), ref_final, atol=1e-5, rtol=1e-5)


def test_conv_pieces_with_saved_state_equal_one_conv_over_the_sequence():
    """Pieces of 5, 2 (shorter than the K-1 = 3 inputs kept), 1 (the step) and 9 tokens, each
    continuing from the state the previous one left, equal one zero-padded conv of all 17."""
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(17, 6, generator=gen), torch.randn(6, 4, generator=gen), torch.randn(6, generator=gen)
    ref = F.conv1d(F.pad(x.t(), (3, 0))[None], weight[:, None], bias, groups=6)[0].t()
    outs, state = [], None
    for lo, hi in [(0, 5), (5, 7), (7, 8), (8, 17)]:
        if hi - lo == 1:
            out, state = fla_ops.causal_conv1d_step(x[lo:hi], weight, bias, state[None])
            state = state[0]
        else:
            out, state = fla_ops.causal_conv1d(x[lo:hi], weight, bias, state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, x[-3:].t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gated_rms_norm_matches_transformers(dtype):
    gen = torch.Generator().manual_seed(0)
    norm = modeling_qwen3_5.Qwen3_5RMSNormGated(24, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3, generator=gen)
    x, z = torch.randn(2, 5, 24, generator=gen).to(dtype), torch.randn(2, 5, 24, generator=gen).to(dtype)
    assert torch.equal(fla_ops.gated_rms_norm(x, z, norm.weight.data, 1e-6), norm(x, z))


LINEAR = dict(hidden_size=32, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
              linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6, num_hidden_layers=1,
              layer_types=["linear_attention"], vocab_size=16, num_attention_heads=2, num_key_value_heads=1)
HF_LAYERS = {
    "qwen3_5": (transformers.Qwen3_5TextConfig, modeling_qwen3_5.Qwen3_5GatedDeltaNet),
    "qwen3_next": (transformers.Qwen3NextConfig, modeling_qwen3_next.Qwen3NextGatedDeltaNet),
}


def _layers(kind):
    config_cls, layer_cls = HF_LAYERS[kind]
    config = config_cls(**LINEAR)
    torch.manual_seed(0)
    hf = layer_cls(config, layer_idx=0).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0.0, 0.3)
    with default_dtype(torch.float32):
        ours = GatedDeltaNet(config)
    loaded = set()
    for name, tensor in hf.state_dict().items():
        loaded |= set(ours.load_hf_weight(name, tensor))
    assert loaded == {name for name, _ in ours.named_parameters()}
    return hf, ours


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(HF_LAYERS))
@pytest.mark.parametrize("ops", ["auto", "gdn_ops"])
@torch.no_grad()
def test_layer_matches_transformers_over_varlen_steps(kind, device, ops):
    """Prefills, prefill chunks continuing from saved state, single-token sequences (new and
    continuing) next to them, and pure decode steps: every output row equals transformers' layer
    run over the whole sequence. Fresh slots hold NaN: a new sequence must not read its slot.
    ``ops``: the layer's choice (CPU: the PyTorch ops; a GPU: the CUDA kernels where built), or
    layers/gdn_ops.py forced (its PyTorch path on CPU: the wiring of the kernels' arguments)."""
    hf, ours = _layers(kind)
    ours.to(device)
    ours.use_kernels = True if ops == "gdn_ops" else None
    gen = torch.Generator().manual_seed(1)
    full = {s: torch.randn(n, 32, generator=gen) for s, n in (("a", 75), ("b", 12), ("c", 4), ("d", 3))}
    ref = {s: hf(x[None])[0] for s, x in full.items()}
    spec = ours.state_spec(torch.float32)
    assert spec == MambaSpec(shapes=((2 * 16 + 48, 3), (4, 8, 12)), dtypes=(torch.float32, torch.float32))
    state = tuple(torch.full((6, *shape), float("nan"), dtype=dt, device=device)
                  for shape, dt in zip(spec.shapes, spec.dtypes))
    slots = {"a": 4, "b": 2, "c": 5, "d": 1}
    schedule = [
        {"c": (0, 1), "d": (0, 1)},  # pure decode path, both sequences new
        {"a": (0, 70), "b": (0, 1), "c": (1, 3)},  # a crosses a 64-token chunk; b new, single token
        {"a": (70, 71), "b": (1, 9), "c": (3, 4), "d": (1, 3)},  # decode next to continuing chunks
        {"a": (71, 72), "b": (9, 10)},  # pure decode, continuing
        {"a": (72, 75), "b": (10, 12)},
    ]
    for step_no, step in enumerate(schedule):
        ids = list(step)
        md = build_attn_metadata([step[s][0] for s in ids], [step[s][1] - step[s][0] for s in ids],
                                 [[0] * 20 for _ in ids], 4, device, state_slots=[slots[s] for s in ids])
        x = torch.cat([full[s][lo:hi] for s, (lo, hi) in step.items()]).to(device)
        out = ours(x, state, md).cpu()
        start = 0
        for s, (lo, hi) in step.items():
            torch.testing.assert_close(out[start:start + hi - lo], ref[s][lo:hi], atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"step {step_no}, sequence {s}: {m}")
            start += hi - lo


def test_tensor_parallel_ranks_hold_their_heads(set_tp):
    """Rank 1 of 2 holds key head 1 and value heads 2-3: its conv channels, A_log and
    projection rows are those heads' rows of the checkpoint."""
    hf, _ = _layers("qwen3_5")
    set_tp(1, 2)
    with default_dtype(torch.float32):
        ours = GatedDeltaNet(transformers.Qwen3_5TextConfig(**LINEAR))
    for name, tensor in hf.state_dict().items():
        ours.load_hf_weight(name, tensor)
    conv = hf.conv1d.weight[:, 0]
    assert torch.equal(ours.conv_weight, torch.cat([conv[8:16], conv[24:32], conv[56:80]]))
    assert torch.equal(ours.A_log, hf.A_log[2:]) and torch.equal(ours.dt_bias, hf.dt_bias[2:])
    w = hf.in_proj_qkv.weight
    assert torch.equal(ours.in_proj_qkvz.weight, torch.cat([w[8:16], w[24:32], w[56:80], hf.in_proj_z.weight[24:48]]))
    assert torch.equal(ours.in_proj_ba.weight, torch.cat([hf.in_proj_b.weight[2:], hf.in_proj_a.weight[2:]]))
    assert torch.equal(ours.out_proj.weight, hf.out_proj.weight[:, 24:])
    assert ours.state_spec(torch.float16).shapes == ((8 + 8 + 24, 3), (2, 8, 12))


def test_bad_configs_name_the_field():
    with pytest.raises(ValueError, match="mamba_ssm_dtype"):
        ssm_state_dtype(transformers.Qwen3_5TextConfig(**LINEAR, mamba_ssm_dtype="float8"))
    assert ssm_state_dtype(transformers.Qwen3_5TextConfig(**LINEAR, mamba_ssm_dtype="bfloat16")) == torch.bfloat16
    with pytest.raises(ValueError, match="hidden_act"):
        GatedDeltaNet(transformers.Qwen3_5TextConfig(**{**LINEAR, "hidden_act": "gelu"}))
    with quantization(AWQConfig(32)), pytest.raises(ValueError, match="quantiz"):
        GatedDeltaNet(transformers.Qwen3_5TextConfig(**LINEAR))
    with pytest.raises(ValueError, match="in_proj_qkv"):
        _layers("qwen3_5")[1].load_hf_weight("in_proj_qkv.weight", torch.zeros(10, 32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", list(HF_LAYERS))
@torch.no_grad()
def test_half_precision_prefill_matches_transformers(kind, dtype):
    """In bfloat16 / float16 a whole-prompt prefill (two delta-rule chunks) rounds where
    transformers' layer does (beta in the model dtype, g and the delta rule in float32, the gated
    norm's casts): outputs equal to within one rounding of the model dtype."""
    hf, ours = _layers(kind)
    hf.to(dtype)
    ours.to(dtype)
    x = torch.randn(70, 32, generator=torch.Generator().manual_seed(2)).to(dtype)
    spec = ours.state_spec(dtype)
    state = tuple(torch.zeros((2, *shape), dtype=dt) for shape, dt in zip(spec.shapes, spec.dtypes))
    md = build_attn_metadata([0], [70], [[0] * 20], 4, state_slots=[1])
    out, ref = ours(x, state, md).float(), hf(x[None])[0].float()
    tol = {torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]  # a unit in the last place
    torch.testing.assert_close(out, ref, atol=tol * ref.abs().max().item(), rtol=0)
