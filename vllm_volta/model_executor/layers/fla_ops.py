"""Gated DeltaNet's ops in plain PyTorch: the causal depthwise conv1d, the gated delta rule
(chunked for prefill, one step for decode) and the gated RMSNorm.

These are the ops flash-linear-attention and causal-conv1d provide as kernels, written as
tensor ops so they run on every device (CPU, V100 and newer); the semantics are those of
transformers' Qwen3-Next / Qwen3.5 reference code.

The gated delta rule, per value head, with a state S [Dk, Dv] (keys index rows, values
columns) and, for every token t, a log-decay g_t <= 0 and a write strength beta_t in (0, 1):

    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
    o_t = S_t^T q_t

Everything here runs in float32 (callers convert): the recurrence accumulates over the whole
context, and transformers computes it in float32 too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Chunks whose intra-chunk products are built at once (chunked delta rule): 16 x 64 tokens.
_CHUNKS_PER_GROUP = 16


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (eps inside the root, as the reference)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, state: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of B sequences: q, k [B, H, Dk], v [B, H, Dv], g, beta [B, H], state
    [B, H, Dk, Dv] (float32) -> (o [B, H, Dv], the new state). No host sync (decode steps)."""
    state = state * g.exp()[..., None, None]
    predicted = torch.einsum("bhk,bhkv->bhv", k, state)
    u = beta[..., None] * (v - predicted)
    state = state + k[..., :, None] * u[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", q, state), state


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                           chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k [L, H, Dk], v [L, H, Dv], g, beta [L, H] (float32), initial_state
    [H, Dk, Dv] or None (zeros) -> (o [L, H, Dv], the state after the last token).

    Within a chunk of C tokens, with gamma_t the cumulative log-decay since the chunk began and
    S_0 the state before it, the writes u_t solve a unit lower-triangular system
    (I + A) U = beta (V - exp(gamma) K S_0), A[t, s] = beta_t exp(gamma_t - gamma_s) k_t.k_s
    for s < t; the outputs and the next state then follow from matrix products. Only the
    state is carried from chunk to chunk, so the Python loop runs over chunks, not tokens.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    length, heads, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (-length) % c
    n = (length + pad) // c

    def chunks(x: torch.Tensor) -> torch.Tensor:
        # [L, H, ...] -> [H, N, C, ...]; padded tokens (g = beta = k = v = 0) leave S unchanged
        x = x.transpose(0, 1)
        x = F.pad(x, (0, 0, 0, pad)) if x.dim() == 3 else F.pad(x, (0, pad))
        return x.reshape(heads, n, c, *x.shape[2:])

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    state = (torch.zeros(heads, dk, dv, dtype=q.dtype, device=q.device) if initial_state is None
             else initial_state.to(q.dtype))
    out = torch.empty(heads, n, c, dv, dtype=q.dtype, device=q.device)
    # The [H, chunks, C, C] intra-chunk tensors are built for a group of chunks at a time, so
    # their memory stays bounded however long the prompt.
    for lo in range(0, n, _CHUNKS_PER_GROUP):
        hi = min(lo + _CHUNKS_PER_GROUP, n)
        state = _chunk_group(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], beta[:, lo:hi], state,
                             out[:, lo:hi])
    return out.reshape(heads, n * c, dv)[:, :length].transpose(0, 1), state


def _chunk_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Consecutive chunks ([H, N, C, ...]) from ``state``: outputs into ``out``, returns the state
    after the last chunk."""
    c = q.shape[2]
    gamma = g.cumsum(dim=-1)  # [H, N, C]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    # exp(gamma_t - gamma_s) for s <= t, 0 above the diagonal (masked before exp: no overflow)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    a = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = a + torch.eye(c, dtype=a.dtype, device=a.device)
    u_from_v = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
    w_from_s = torch.linalg.solve_triangular(system, (beta * gamma.exp())[..., None] * k, upper=False,
                                             unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay  # intra-chunk q.k, s <= t
    q_decayed = q * gamma.exp()[..., None]  # reads S_0 decayed to t
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]  # writes decayed to the chunk end
    chunk_decay = gamma[..., -1].exp()  # [H, N]
    for i in range(q.shape[1]):
        u = u_from_v[:, i] - w_from_s[:, i] @ state
        out[:, i] = q_decayed[:, i] @ state + scores[:, i] @ u
        state = state * chunk_decay[:, i, None, None] + k_to_end[:, i].transpose(-1, -2) @ u
    return state


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  initial_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of one sequence: x [L, C], weight [C, K], initial_state [C, K-1]
    (the K-1 inputs before x; None = zeros) -> (out [L, C], the last K-1 inputs [C, K-1])."""
    channels, width = weight.shape
    history = (x.new_zeros(channels, width - 1) if initial_state is None
               else initial_state.to(x.dtype))
    full = torch.cat([history, x.t()], dim=1)  # [C, K-1+L]
    out = F.conv1d(full.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), bias, groups=channels)[0]
    return out.t().to(x.dtype), full[:, full.shape[1] - (width - 1):]


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of B sequences: x [B, C], state [B, C, K-1] -> (out [B, C], new state)."""
    window = torch.cat([state.to(x.dtype), x.unsqueeze(-1)], dim=-1)  # [B, C, K]
    out = (window.to(weight.dtype) * weight).sum(dim=-1)
    if bias is not None:
        out = out + bias
    return out.to(x.dtype), window[..., 1:]


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rmsnorm(x) * silu(gate) over the last dim: the norm in float32, rounded to x's
    dtype before the weight, the gate applied in float32 (as transformers' RMSNormGated)."""
    dtype = x.dtype
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return ((weight * normed) * F.silu(gate.float())).to(dtype)
