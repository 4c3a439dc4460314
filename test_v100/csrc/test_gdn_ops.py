"""Gated DeltaNet ops (layers/gdn_ops.py) on CPU: the PyTorch path against a step-by-step
float64 recurrence (gdn_cases.py) and against transformers' own Qwen3.5 functions (recurrence,
causal conv1d), across calls (chunked prefill, then decodes) with states written back by slot;
argument errors of the PyTorch path and of the CUDA ops' checks (their Meta kernels).
The CUDA kernels are tested in test_gdn_kernels.py."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import vllm_volta._custom_ops  # noqa: F401  (registers torch.ops._C.*)
from vllm_volta.model_executor.layers import gdn_ops
from vllm_volta.model_executor.layers import gdn_reference as ref

from .gdn_cases import continue_across_calls, make_conv, make_gdn, naive_recurrence


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
    # The HF layer repeats each key head for its value heads before this function (older
    # transformers' version of it needs that; newer ones accept either).
    group = x["v"].shape[1] // x["q"].shape[1]
    q, k = x["q"].repeat_interleave(group, dim=1), x["k"].repeat_interleave(group, dim=1)
    for i, (lo, hi) in enumerate(((0, 4), (4, 11))):
        slot = int(x["state_slots"][i])
        o, s = qwen.torch_recurrent_gated_delta_rule(
            q[None, lo:hi], k[None, lo:hi], x["v"][None, lo:hi], g=g[None, lo:hi], beta=beta[None, lo:hi],
            initial_state=state0[slot][None], output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[lo:hi], o[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x["state"][slot], s[0], rtol=1e-5, atol=1e-5)


def test_reference_continues_across_calls_and_writes_only_its_slot():
    x = make_gdn([12], 2, 4, 8, 8, dtype=torch.float64, state_dtype=torch.float64)
    state0 = x["state"].clone()
    out, state = continue_across_calls(dict(x, state=x["state"].clone()), 5, 3, "cpu")
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


# ---------------------------------------------------------------- the CUDA ops' checks (Meta kernels)


def _meta_gdn(**overrides) -> dict:
    """Valid prefill arguments on the meta device (2 sequences, 5 tokens), with overrides."""
    def m(*shape, dtype=torch.float16):
        return torch.empty(*shape, dtype=dtype, device="meta")
    args = dict(out=m(5, 4, 6), q=m(5, 40)[:, :16].view(5, 2, 8), k=m(5, 2, 8), v=m(5, 4, 6), a=m(5, 4),
                b=m(5, 4, dtype=torch.float32), state=m(3, 4, 8, 6, dtype=torch.float32),
                state_slots=m(2, dtype=torch.int32), query_start_loc=m(3, dtype=torch.int32),
                has_initial_state=m(2, dtype=torch.bool), scale=0.3, qk_l2norm=True,
                A_log=m(4, dtype=torch.float32), dt_bias=m(4, dtype=torch.float32), col_threads=0)
    args.update(overrides)
    return args


def _m(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


META_BAD_ARGS = [
    (dict(k=_m(5, 2, 8, dtype=torch.float32)), "'k' has dtype float32 but 'q' has float16; they must match"),
    (dict(q=_m(5, 16, 2).transpose(1, 2)), "'q' must have its heads packed in each token row"),
    (dict(v=_m(5, 3, 6), out=_m(5, 3, 6)), "the value heads of 'v' (3) must be a multiple of the key heads"),
    (dict(q=_m(5, 2, 300), k=_m(5, 2, 300)), "the key head dim of 'q' / 'k' must be in [1, 256], got 300"),
    (dict(out=_m(5, 6, 4).transpose(1, 2)), "'out' must be contiguous"),
    (dict(a=_m(5, 3)), "'a' must be [5, 4] (tokens, value heads)"),
    (dict(state=_m(3, 4, 8, 6, dtype=torch.bfloat16)), "'state' must be float32 or the dtype of 'q' (float16)"),
    (dict(state=_m(3, 4, 6, 8, dtype=torch.float32)), "'state' must be [num_slots, 4, 8, 6]"),
    (dict(state_slots=_m(2, dtype=torch.int64)), "'state_slots' must be a contiguous 1-D int32 tensor"),
    (dict(query_start_loc=_m(2, dtype=torch.int32)), "'query_start_loc' must have 3 entries, got 2"),
    (dict(has_initial_state=_m(2, dtype=torch.int32)), "'has_initial_state' must be a contiguous 1-D bool tensor"),
    (dict(scale=0.0), "'scale' must be > 0"),
    (dict(dt_bias=None), "'A_log' and 'dt_bias' must be given together"),
    (dict(A_log=_m(3, dtype=torch.float32)), "'A_log' must be a contiguous 1-D tensor of 4 entries"),
]

_HAS_GDN_OPS = hasattr(torch.ops._C, "gated_delta_rule_prefill")
needs_gdn_ops = pytest.mark.skipif(not _HAS_GDN_OPS, reason="the built extension predates the Gated DeltaNet ops")


@needs_gdn_ops
@pytest.mark.parametrize("override,message", META_BAD_ARGS)
def test_cuda_op_checks_name_the_bad_argument(override, message):
    with pytest.raises(RuntimeError, match=re.escape(f"gated_delta_rule_prefill: {message}")):
        torch.ops._C.gated_delta_rule_prefill(**_meta_gdn(**override))


@needs_gdn_ops
def test_cuda_op_checks_accept_valid_arguments():
    torch.ops._C.gated_delta_rule_prefill(**_meta_gdn())
    torch.ops._C.gated_delta_rule_prefill(**_meta_gdn(has_initial_state=None, A_log=None, dt_bias=None))
    args = _meta_gdn(q=_m(2, 2, 8), k=_m(2, 2, 8), v=_m(2, 4, 6), out=_m(2, 4, 6), a=_m(2, 4), b=_m(2, 4))
    for key in ("query_start_loc", "has_initial_state"):
        del args[key]
    torch.ops._C.gated_delta_rule_decode(**args)
    with pytest.raises(RuntimeError, match=re.escape("gated_delta_rule_decode: 'state_slots' must have one entry "
                                                     "per token row of 'q' (2), got 3")):
        torch.ops._C.gated_delta_rule_decode(**dict(args, state_slots=_m(3, dtype=torch.int32)))


@needs_gdn_ops
def test_cuda_conv_checks_name_the_bad_argument():
    base = dict(out=_m(4, 12), x=_m(4, 20)[:, :12], weight=_m(12, 4), bias=None, conv_state=_m(3, 3, 12).transpose(1, 2),
                query_start_loc=_m(3, dtype=torch.int32), state_slots=_m(2, dtype=torch.int32),
                has_initial_state=None, silu=True)
    torch.ops._C.causal_conv1d_fn(**base)
    cases = [(dict(weight=_m(12, 5)), "the kernel size (columns of 'weight') must be in [2, 4], got 5"),
             (dict(conv_state=_m(3, 12, 2)), "'conv_state' must be [num_slots, 12, 3]"),
             (dict(bias=_m(11)), "'bias' must be a contiguous 1-D tensor of 12 entries"),
             (dict(x=_m(4, 12, dtype=torch.float32)), "'out' has dtype float16 but 'x' has float32")]
    for override, message in cases:
        with pytest.raises(RuntimeError, match=re.escape(f"causal_conv1d_fn: {message}")):
            torch.ops._C.causal_conv1d_fn(**dict(base, **override))
    update = {k: v for k, v in base.items() if k not in ("query_start_loc", "has_initial_state")}
    with pytest.raises(RuntimeError, match=re.escape("causal_conv1d_update: 'state_slots' must have one entry")):
        torch.ops._C.causal_conv1d_update(**update)
