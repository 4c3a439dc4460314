"""Plain-PyTorch Gated DeltaNet ops: the CPU path of ``gdn_ops`` and the reference its CUDA kernels
are tested against (run in float64 there).

Same contracts as the CUDA ops (``gdn_ops`` documents them); the math runs in float32, or in
float64 when any input is float64, and results are stored in the output / state dtypes:
- gated delta rule, per sequence and value head h (key head h // (Hv / Hk)):
  S <- S * exp(g_t); S <- S + k_t (beta_t * (v_t - S^T k_t))^T; o_t = S^T (q_t * scale),
  q, k L2-normalised first when asked (x * rsqrt(|x|^2 + 1e-6));
- causal conv1d: out_t = act(bias + sum_i w[:, i] * x_ext[t - (W - 1) + i]) over the sequence's
  inputs preceded by its conv state, the sum rounded to the input dtype before the activation.
Sequences whose slot is negative are skipped: zeros out, states untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 if any given tensor is float64, else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) in ``dtype``: from the raw projections when ``A_log`` / ``dt_bias`` are given
    (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)), else ``a`` and ``b`` themselves."""
    if A_log is None:
        return a.to(dtype), b.to(dtype)
    g = -A_log.to(dtype).exp() * F.softplus(a.to(dtype) + dt_bias.to(dtype))
    return g, torch.sigmoid(b.to(dtype))


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     state: torch.Tensor, state_slots: torch.Tensor, query_start_loc: torch.Tensor,
                     has_initial_state: torch.Tensor | None, scale: float, qk_l2norm: bool,
                     A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """Varlen recurrence over tokens ``query_start_loc[i]:query_start_loc[i + 1]`` of sequence i,
    in place on ``out`` [N, Hv, Dv] and ``state`` [num_slots, Hv, Dk, Dv]."""
    dt = compute_dtype(q, v, state)
    group = v.shape[1] // q.shape[1]
    g, beta = gdn_gates(a, b, A_log, dt_bias, dt)
    starts = query_start_loc.tolist()
    slots = state_slots.tolist()
    init = [True] * len(slots) if has_initial_state is None else has_initial_state.tolist()
    for i, slot in enumerate(slots):
        lo, hi = starts[i], starts[i + 1]
        if slot < 0:
            out[lo:hi] = 0
            continue
        qs = q[lo:hi].to(dt).repeat_interleave(group, dim=1)  # [L, Hv, Dk]
        ks = k[lo:hi].to(dt).repeat_interleave(group, dim=1)
        vs = v[lo:hi].to(dt)
        if qk_l2norm:
            qs, ks = _l2norm(qs), _l2norm(ks)
        qs = qs * scale
        s = state[slot].to(dt) if init[i] else state.new_zeros(state.shape[1:], dtype=dt)
        for t in range(hi - lo):
            s = s * g[lo + t].exp()[:, None, None]
            kv_mem = torch.einsum("hkv,hk->hv", s, ks[t])
            delta = (vs[t] - kv_mem) * beta[lo + t][:, None]
            s = s + ks[t][:, :, None] * delta[:, None, :]
            out[lo + t] = torch.einsum("hkv,hk->hv", s, qs[t]).to(out.dtype)
        state[slot] = s.to(state.dtype)


def _conv_window_out(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool,
                     x_dtype: torch.dtype, dt: torch.dtype) -> torch.Tensor:
    """Outputs of the windows ``window`` [L + W - 1, C] -> [L, C]."""
    width = weight.shape[1]
    w = weight.to(dt)
    acc = sum(window[i:window.shape[0] - (width - 1) + i] * w[:, i] for i in range(width))
    if bias is not None:
        acc = acc + bias.to(dt)
    acc = acc.to(x_dtype).to(dt) if x_dtype != torch.float64 else acc  # as a conv in x's dtype stores it
    return F.silu(acc) if silu else acc


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                  state_slots: torch.Tensor, query_start_loc: torch.Tensor,
                  has_initial_state: torch.Tensor | None, silu: bool, out: torch.Tensor) -> None:
    """Varlen causal depthwise conv1d, in place on ``out`` [N, C] and ``conv_state``
    [num_slots, C, W - 1] (the last W - 1 inputs of each channel, oldest first)."""
    dt = compute_dtype(x, weight)
    starts = query_start_loc.tolist()
    slots = state_slots.tolist()
    init = [True] * len(slots) if has_initial_state is None else has_initial_state.tolist()
    keep = weight.shape[1] - 1
    for i, slot in enumerate(slots):
        lo, hi = starts[i], starts[i + 1]
        if slot < 0:
            out[lo:hi] = 0
            continue
        prev = conv_state[slot].t().to(dt) if init[i] else x.new_zeros((keep, x.shape[1]), dtype=dt)
        window = torch.cat([prev, x[lo:hi].to(dt)])  # [W - 1 + L, C]
        out[lo:hi] = _conv_window_out(window, weight, bias, silu, x.dtype, dt).to(out.dtype)
        conv_state[slot] = window[window.shape[0] - keep:].t().to(conv_state.dtype)
