"""Gated DeltaNet ops (layers/gdn_ops.py, csrc/gdn_kernels.cu).

CPU: the PyTorch path against a step-by-step float64 recurrence written here and against
transformers' own Qwen3.5 functions (recurrence, causal conv1d), across calls (chunked prefill,
then decodes) with states written back by slot; argument errors of both paths.
GPU: the CUDA kernels against the PyTorch path run in float64, float16 and float32 activations,
awkward head sizes, strided inputs, fused gates, every tile width, skipped and padded rows.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers import gdn_ops
from vllm_volta.model_executor.layers import gdn_reference as ref

from .op_cases import requires_gpu


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


def make_gdn(lens: list[int], hk: int, hv: int, dk: int, dv: int, *, dtype=torch.float32, fused: bool = True,
             strided: bool = False, num_slots: int = 9, seed: int = 0, state_dtype=torch.float32) -> dict:
    """Inputs of one varlen call (CPU): q, k, v (views of one wide buffer if strided), gates,
    a random state per slot and distinct random slots (never 0)."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    width = 2 * hk * dk + hv * dv + (5 if strided else 0)
    buf = torch.randn(n, width, generator=gen).to(dtype)
    if not strided:
        buf = buf.contiguous()
    q = buf[:, :hk * dk].view(n, hk, dk)
    k = buf[:, hk * dk:2 * hk * dk].view(n, hk, dk)
    v = buf[:, 2 * hk * dk:2 * hk * dk + hv * dv].view(n, hv, dv)
    if not strided:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if fused:
        a = torch.randn(n, hv, generator=gen).to(dtype)
        b = torch.randn(n, hv, generator=gen).to(dtype)
        A_log = torch.empty(hv).uniform_(1, 16, generator=gen).log()
        dt_bias = torch.randn(hv, generator=gen)
    else:
        a = -torch.empty(n, hv).uniform_(0.01, 2.0, generator=gen)  # g, the log decay
        b = torch.rand(n, hv, generator=gen)  # beta
        A_log = dt_bias = None
    state = (0.5 * torch.randn(num_slots, hv, dk, dv, generator=gen)).to(state_dtype)
    slots = (torch.randperm(num_slots - 1, generator=gen)[:len(lens)] + 1).to(torch.int32)
    return dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, state_slots=slots,
                query_start_loc=_qsl(lens))


def naive_recurrence(q, k, v, g, beta, s0, scale, l2norm):
    """Token by token, head by head, in float64: S <- S e^g; S <- S + k (beta (v - S^T k))^T; o = S^T q."""
    hv, group = v.shape[1], v.shape[1] // q.shape[1]
    out = torch.zeros(v.shape, dtype=torch.float64)
    s_all = s0.double().clone()
    for h in range(hv):
        s = s_all[h]
        for t in range(q.shape[0]):
            qt, kt = q[t, h // group].double(), k[t, h // group].double()
            if l2norm:
                qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
            s = s * torch.exp(g[t, h].double())
            delta = beta[t, h].double() * (v[t, h].double() - s.T @ kt)
            s = s + torch.outer(kt, delta)
            out[t, h] = s.T @ (qt * scale)
        s_all[h] = s
    return out, s_all


# ---------------------------------------------------------------- CPU: the PyTorch path


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 4, 8, 6), (3, 3, 5, 7)])
def test_reference_matches_naive_float64_recurrence(fused, hk, hv, dk, dv):
    lens = [3, 0, 5, 1]
    x = make_gdn(lens, hk, hv, dk, dv, dtype=torch.float64, fused=fused, strided=True,
                 state_dtype=torch.float64)
    state0 = x["state"].clone()
    init = torch.tensor([True, True, False, True])
    out = gdn_ops.gated_delta_rule_prefill(x["q"], x["k"], x["v"], x["a"], x["b"], x["state"], x["state_slots"],
                                           x["query_start_loc"], init, A_log=x["A_log"], dt_bias=x["dt_bias"])
    g, beta = ref.gdn_gates(x["a"], x["b"], x["A_log"], x["dt_bias"], torch.float64)
    expected_state = state0.clone()
    for i, (lo, hi) in enumerate(zip(x["query_start_loc"][:-1].tolist(), x["query_start_loc"][1:].tolist())):
        slot = int(x["state_slots"][i])
        s0 = state0[slot] if init[i] else torch.zeros_like(state0[slot])
        o, s = naive_recurrence(x["q"][lo:hi], x["k"][lo:hi], x["v"][lo:hi], g[lo:hi], beta[lo:hi], s0,
                                dk ** -0.5, True)
        torch.testing.assert_close(out[lo:hi], o, rtol=1e-10, atol=1e-10)
        expected_state[slot] = s
    torch.testing.assert_close(x["state"], expected_state, rtol=1e-10, atol=1e-10)


def test_reference_matches_transformers_qwen3_5():
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    lens = [4, 7]
    x = make_gdn(lens, 2, 4, 16, 8, fused=True)
    state0 = x["state"].clone()
    out = gdn_ops.gated_delta_rule_prefill(x["q"], x["k"], x["v"], x["a"], x["b"], x["state"], x["state_slots"],
                                           x["query_start_loc"], A_log=x["A_log"], dt_bias=x["dt_bias"])
    # As the HF layer forms them: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias).
    beta = x["b"].sigmoid()
    g = -x["A_log"].exp() * F.softplus(x["a"] + x["dt_bias"])
    for i, (lo, hi) in enumerate(((0, 4), (4, 11))):
        slot = int(x["state_slots"][i])
        o, s = qwen.torch_recurrent_gated_delta_rule(
            x["q"][None, lo:hi], x["k"][None, lo:hi], x["v"][None, lo:hi], g=g[None, lo:hi], beta=beta[None, lo:hi],
            initial_state=state0[slot][None], output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[lo:hi], o[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x["state"][slot], s[0], rtol=1e-5, atol=1e-5)


def _continue_across_calls(x: dict, split: int, num_decodes: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence (tokens of x) as prefill [0, split), prefill [split, n - num_decodes), then
    decodes; returns the concatenated outputs and the state tensor after the calls."""
    move = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    n = move["q"].shape[0]
    slot = move["state_slots"][:1]
    outs = []
    bounds = [(0, split, False), (split, n - num_decodes, True)]
    for lo, hi, init in bounds:
        qsl = torch.tensor([0, hi - lo], dtype=torch.int32, device=device)
        outs.append(gdn_ops.gated_delta_rule_prefill(
            move["q"][lo:hi], move["k"][lo:hi], move["v"][lo:hi], move["a"][lo:hi], move["b"][lo:hi], move["state"],
            slot, qsl, torch.tensor([init], device=device), A_log=move["A_log"], dt_bias=move["dt_bias"]))
    for t in range(n - num_decodes, n):
        outs.append(gdn_ops.gated_delta_rule_decode(
            move["q"][t:t + 1], move["k"][t:t + 1], move["v"][t:t + 1], move["a"][t:t + 1], move["b"][t:t + 1],
            move["state"], slot, A_log=move["A_log"], dt_bias=move["dt_bias"]))
    return torch.cat(outs).cpu(), move["state"].cpu()


def test_reference_continues_across_calls_and_writes_only_its_slot():
    x = make_gdn([12], 2, 4, 8, 8, dtype=torch.float64, state_dtype=torch.float64)
    state0 = x["state"].clone()
    out, state = _continue_across_calls(dict(x, state=x["state"].clone()), 5, 3, "cpu")
    whole = x["state"].clone()
    expected = gdn_ops.gated_delta_rule_prefill(x["q"], x["k"], x["v"], x["a"], x["b"], whole, x["state_slots"],
                                                x["query_start_loc"], torch.tensor([False]), A_log=x["A_log"],
                                                dt_bias=x["dt_bias"])
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, whole, rtol=1e-10, atol=1e-10)
    others = [s for s in range(state.shape[0]) if s != int(x["state_slots"][0])]
    assert torch.equal(state[others], state0[others])


def test_reference_skips_negative_slots():
    x = make_gdn([2, 3], 1, 2, 4, 4)
    x["state_slots"][1] = -1
    state0 = x["state"].clone()
    out = gdn_ops.gated_delta_rule_prefill(x["q"], x["k"], x["v"], x["a"], x["b"], x["state"], x["state_slots"],
                                           x["query_start_loc"], A_log=x["A_log"], dt_bias=x["dt_bias"])
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    slot = int(x["state_slots"][0])
    others = [s for s in range(state0.shape[0]) if s != slot]
    assert torch.equal(x["state"][others], state0[others]) and not torch.equal(x["state"][slot], state0[slot])


def make_conv(lens: list[int], channels: int, width: int, *, dtype=torch.float32, bias: bool = True,
              transposed_state: bool = False, num_slots: int = 7, seed: int = 0, strided: bool = False) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    x = torch.randn(n, channels + (3 if strided else 0), generator=gen).to(dtype)[:, :channels]
    weight = (0.5 * torch.randn(channels, width, generator=gen)).to(dtype)
    b = torch.randn(channels, generator=gen).to(dtype) if bias else None
    st = torch.randn(num_slots, width - 1, channels, generator=gen).to(dtype)
    conv_state = st.transpose(1, 2) if transposed_state else st.transpose(1, 2).contiguous()
    slots = (torch.randperm(num_slots - 1, generator=gen)[:len(lens)] + 1).to(torch.int32)
    return dict(x=x, weight=weight, bias=b, conv_state=conv_state, state_slots=slots, query_start_loc=_qsl(lens))


@pytest.mark.parametrize("width", [2, 3, 4])
def test_conv_reference_matches_transformers(width):
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    lens = [1, 6, 2]
    c = make_conv(lens, 10, width, dtype=torch.float64)
    state0 = c["conv_state"].clone()
    init = torch.tensor([True, False, True])
    out = gdn_ops.causal_conv1d_fn(c["x"], c["weight"], c["bias"], c["conv_state"], c["query_start_loc"],
                                   c["state_slots"], init)
    qsl = c["query_start_loc"].tolist()
    for i in range(len(lens)):
        slot = int(c["state_slots"][i])
        prev = state0[slot] if init[i] else torch.zeros_like(state0[slot])
        seq = c["x"][qsl[i]:qsl[i + 1]].t()[None]  # [1, C, L]
        # transformers' prefill convolves state ++ inputs with zero left padding and keeps the tail.
        full = qwen.causal_conv1d_fn(torch.cat([prev[None], seq], -1), c["weight"], c["bias"], activation="silu")
        torch.testing.assert_close(out[qsl[i]:qsl[i + 1]], full[0, :, width - 1:].t(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c["conv_state"][slot], torch.cat([prev, seq[0]], -1)[:, -(width - 1):])
    # Decode: transformers' update with its [B, C, W - 1] state against ours by slot.
    x1 = torch.randn(len(lens), 10, dtype=torch.float64)
    hf_state = c["conv_state"][c["state_slots"].long()].clone()
    expected = qwen.causal_conv1d_update(x1[:, :, None], hf_state, c["weight"], c["bias"], activation="silu")
    got = gdn_ops.causal_conv1d_update(x1, c["weight"], c["bias"], c["conv_state"], c["state_slots"])
    torch.testing.assert_close(got, expected[:, :, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c["conv_state"][c["state_slots"].long()], hf_state)


PY_BAD_ARGS = [
    (dict(k="half"), "'k' has dtype torch.float16 but 'q' has torch.float32"),
    (dict(v="heads"), "must be a multiple of the key heads"),
    (dict(state="shape"), "'state' must be [num_slots, 4, 8, 6]"),
    (dict(A_log=None), "'A_log' and 'dt_bias' must be given together"),
    (dict(state_slots="int64"), "'state_slots' must be a 1-D int32 tensor"),
    (dict(query_start_loc="short"), "'query_start_loc' must be a 1-D int32 tensor of 3 entries"),
]


@pytest.mark.parametrize("override,message", PY_BAD_ARGS)
def test_python_path_names_the_bad_argument(override, message):
    x = make_gdn([2, 3], 2, 4, 8, 6)
    bad = {"half": x["k"].half(), "heads": torch.zeros(5, 3, 6), "shape": torch.zeros(3, 4, 6, 8),
           "int64": x["state_slots"].long(), "short": torch.zeros(2, dtype=torch.int32), None: None}
    x.update({key: bad[val] for key, val in override.items()})
    with pytest.raises(ValueError, match="gated_delta_rule_prefill: .*" + re.escape(message)):
        gdn_ops.gated_delta_rule_prefill(x["q"], x["k"], x["v"], x["a"], x["b"], x["state"], x["state_slots"],
                                         x["query_start_loc"], A_log=x["A_log"], dt_bias=x["dt_bias"])


def test_conv_python_path_names_the_bad_argument():
    c = make_conv([2], 6, 4)
    with pytest.raises(ValueError, match="causal_conv1d_update: 'activation' must be None, 'silu' or 'swish'"):
        gdn_ops.causal_conv1d_update(c["x"], c["weight"], None, c["conv_state"], c["state_slots"][:2],
                                     activation="gelu")
    with pytest.raises(ValueError, match=r"causal_conv1d_fn: 'conv_state' must be \[num_slots, 6, 3\]"):
        gdn_ops.causal_conv1d_fn(c["x"], c["weight"], None, c["conv_state"][:, :, :2], c["query_start_loc"],
                                 c["state_slots"])
