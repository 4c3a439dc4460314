"""Inputs and a float64 step-by-step reference for the Gated DeltaNet op tests (test_gdn_ops.py on
CPU, test_gdn_kernels.py on a GPU)."""

from __future__ import annotations

import torch

from vllm_volta.model_executor.layers import gdn_ops


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


def make_gdn(lens: list[int], hk: int, hv: int, dk: int, dv: int, *, dtype=torch.float32, fused: bool = True,
             strided: bool = False, num_slots: int = 9, seed: int = 0, state_dtype=torch.float32,
             device: str = "cpu") -> dict:
    """Inputs of one varlen call on ``device`` (drawn on the CPU, so every device gets the same
    values): q, k, v (views of one wide buffer there if strided), gates, a random state per slot
    and distinct random slots (never 0)."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    width = 2 * hk * dk + hv * dv + (5 if strided else 0)
    buf = torch.randn(n, width, generator=gen).to(dtype).to(device)
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
    rest = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, state_slots=slots, query_start_loc=_qsl(lens))
    return dict(q=q, k=k, v=v, **{key: None if t is None else t.to(device) for key, t in rest.items()})


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


def continue_across_calls(x: dict, split: int, num_decodes: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
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


def make_conv(lens: list[int], channels: int, width: int, *, dtype=torch.float32, bias: bool = True,
              transposed_state: bool = False, num_slots: int = 7, seed: int = 0, strided: bool = False,
              device: str = "cpu") -> dict:
    """Inputs of one varlen conv call on ``device`` (drawn on the CPU): x (rows strided if
    asked), weight, bias, a conv state per slot ([slots, C, W - 1], or a transposed view of
    [slots, W - 1, C] storage) and distinct random slots (never 0)."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    x = torch.randn(n, channels + (3 if strided else 0), generator=gen).to(dtype).to(device)[:, :channels]
    weight = (0.5 * torch.randn(channels, width, generator=gen)).to(dtype)
    b = torch.randn(channels, generator=gen).to(dtype) if bias else None
    st = torch.randn(num_slots, width - 1, channels, generator=gen).to(dtype).to(device)
    conv_state = st.transpose(1, 2) if transposed_state else st.transpose(1, 2).contiguous()
    slots = (torch.randperm(num_slots - 1, generator=gen)[:len(lens)] + 1).to(torch.int32)
    return dict(x=x, weight=weight.to(device), bias=None if b is None else b.to(device), conv_state=conv_state,
                state_slots=slots.to(device), query_start_loc=_qsl(lens).to(device))
