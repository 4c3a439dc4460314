"""Gated DeltaNet ops for the linear-attention layers of Qwen3.5 / Qwen3-Next: the CUDA kernels
(csrc/gdn_kernels.cu) where the tensors are on a GPU and the build has them, else the plain-PyTorch
implementation of ``gdn_reference`` (same contract).

Shapes (N tokens of B sequences, Hk key heads of dim Dk, Hv value heads of dim Dv, C channels):
- ``q``, ``k`` [N, Hk, Dk]; ``v`` [N, Hv, Dv] (token rows may be strided, e.g. views of the conv
  output); ``a``, ``b`` [N, Hv]: the log decay g and beta, or with ``A_log`` / ``dt_bias`` [Hv]
  the raw a / b projections (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), in the
  kernel); output [N, Hv, Dv] in q's dtype;
- ``state`` [num_slots, Hv, Dk, Dv], float32 or q's dtype; ``conv_state`` [num_slots, C, W - 1]
  (x's dtype, any strides); ``state_slots`` [B] int32: each sequence's slot (negative: skipped,
  zeros out, states untouched); ``query_start_loc`` [B + 1] int32; ``has_initial_state`` [B]
  bool (None: every sequence continues from its slot's state; False: starts from zeros).
Slots of one call must be distinct, except padding rows, which may share a scratch slot.
float16 / float32 everywhere; bfloat16 on SM80+ GPUs (and on CPU). Bad arguments raise an error
naming the op and the argument: ValueError on the PyTorch path, RuntimeError from the CUDA op.
"""

from __future__ import annotations

import torch

from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers import gdn_reference as ref

logger = init_logger(__name__)

_FLOATS = (torch.float16, torch.float32, torch.bfloat16, torch.float64)


def _use_cuda(op: str, t: torch.Tensor) -> bool:
    """Whether ``op`` runs the CUDA kernel for tensors like ``t`` (logged once per op and path)."""
    if t.is_cuda:
        from vllm_volta import _custom_ops
        if _custom_ops.has_cuda_kernel(op):
            info_once(logger, "Gated DeltaNet: %s runs the CUDA kernel (%s)", op, t.dtype)
            return True
        info_once(logger, "Gated DeltaNet: %s runs in PyTorch on the GPU (this build has no CUDA kernel for it)", op)
    return False


def _require(cond: bool, op: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{op}: {message}")


def _check_gdn(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               state: torch.Tensor, state_slots: torch.Tensor, A_log: torch.Tensor | None,
               dt_bias: torch.Tensor | None) -> None:
    """The checks the CUDA op makes, for the PyTorch path (same messages' substance)."""
    _require(q.dtype in _FLOATS, op, f"'q' must be float16, float32 or bfloat16, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        _require(t.dtype == q.dtype, op, f"'{name}' has dtype {t.dtype} but 'q' has {q.dtype}; they must match")
    _require(q.dim() == 3 and k.shape == q.shape and v.dim() == 3 and v.shape[0] == q.shape[0], op,
             "'q', 'k' must be [tokens, key_heads, key_head_dim] and 'v' [tokens, value_heads, value_head_dim]")
    n, hk, dk = q.shape
    hv, dv = v.shape[1:]
    _require(hk >= 1 and hv % hk == 0, op,
             f"the value heads of 'v' ({hv}) must be a multiple of the key heads of 'q' / 'k' ({hk})")
    for name, t in (("a", a), ("b", b)):
        _require(t.dtype in _FLOATS and t.shape == (n, hv), op, f"'{name}' must be a float [{n}, {hv}] tensor")
    _require(state.dim() == 4 and tuple(state.shape[1:]) == (hv, dk, dv), op,
             f"'state' must be [num_slots, {hv}, {dk}, {dv}] (slots, value heads, key head dim, value head dim)")
    _require(state.dtype in (torch.float32, torch.float64, q.dtype), op,
             f"'state' must be float32 or the dtype of 'q' ({q.dtype}), got {state.dtype}")
    _require(state_slots.dtype == torch.int32 and state_slots.dim() == 1, op,
             "'state_slots' must be a 1-D int32 tensor")
    _require((A_log is None) == (dt_bias is None), op,
             "'A_log' and 'dt_bias' must be given together (fused gates) or both omitted")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        _require(t is None or tuple(t.shape) == (hv,), op, f"'{name}' must be a 1-D tensor of {hv} entries")


def _check_varlen(op: str, state_slots: torch.Tensor, query_start_loc: torch.Tensor,
                  has_initial_state: torch.Tensor | None) -> None:
    b = state_slots.shape[0]
    _require(query_start_loc.dtype == torch.int32 and tuple(query_start_loc.shape) == (b + 1,), op,
             f"'query_start_loc' must be a 1-D int32 tensor of {b + 1} entries")
    _require(has_initial_state is None or (has_initial_state.dtype == torch.bool
                                           and tuple(has_initial_state.shape) == (b,)), op,
             f"'has_initial_state' must be a 1-D bool tensor of {b} entries")


def _default_scale(dk: int, scale: float | None) -> float:
    return dk ** -0.5 if scale is None else scale


def gated_delta_rule_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                            state: torch.Tensor, state_slots: torch.Tensor, *, A_log: torch.Tensor | None = None,
                            dt_bias: torch.Tensor | None = None, qk_l2norm: bool = True,
                            scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per sequence (B = N): reads each sequence's state once, applies the token,
    writes the state back once; returns ``out`` [B, Hv, Dv]. ``scale`` defaults to Dk ** -0.5."""
    op = "gated_delta_rule_decode"
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device) if out is None else out
    scale = _default_scale(q.shape[-1], scale)
    if _use_cuda(op, q):
        from vllm_volta import _custom_ops
        _custom_ops.gated_delta_rule_decode(out, q, k, v, a, b, state, state_slots, scale, qk_l2norm, A_log, dt_bias)
        return out
    _check_gdn(op, q, k, v, a, b, state, state_slots, A_log, dt_bias)
    _require(state_slots.shape[0] == q.shape[0], op,
             f"'state_slots' must have one entry per token row of 'q' ({q.shape[0]}), got {state_slots.shape[0]}")
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    ref.gated_delta_rule(q, k, v, a, b, state, state_slots, qsl, None, scale, qk_l2norm, A_log, dt_bias, out)
    return out


def gated_delta_rule_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                             state: torch.Tensor, state_slots: torch.Tensor, query_start_loc: torch.Tensor,
                             has_initial_state: torch.Tensor | None = None, *, A_log: torch.Tensor | None = None,
                             dt_bias: torch.Tensor | None = None, qk_l2norm: bool = True,
                             scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Varlen: sequence i is tokens ``query_start_loc[i]:query_start_loc[i + 1]``, continuing from
    its slot's state (or zeros), its final state written back to the slot; returns ``out``."""
    op = "gated_delta_rule_prefill"
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device) if out is None else out
    scale = _default_scale(q.shape[-1], scale)
    if _use_cuda(op, q):
        from vllm_volta import _custom_ops
        _custom_ops.gated_delta_rule_prefill(out, q, k, v, a, b, state, state_slots, query_start_loc,
                                             has_initial_state, scale, qk_l2norm, A_log, dt_bias)
        return out
    _check_gdn(op, q, k, v, a, b, state, state_slots, A_log, dt_bias)
    _check_varlen(op, state_slots, query_start_loc, has_initial_state)
    ref.gated_delta_rule(q, k, v, a, b, state, state_slots, query_start_loc, has_initial_state, scale, qk_l2norm,
                         A_log, dt_bias, out)
    return out


def _check_conv(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                conv_state: torch.Tensor, state_slots: torch.Tensor, activation: str | None) -> bool:
    """Validates the conv arguments; returns whether SiLU is applied."""
    _require(activation in (None, "silu", "swish"), op,
             f"'activation' must be None, 'silu' or 'swish', got {activation!r}")
    _require(x.dtype in _FLOATS and x.dim() == 2, op, "'x' must be a float [tokens, channels] tensor")
    c = x.shape[1]
    _require(weight.dim() == 2 and weight.shape[0] == c and 2 <= weight.shape[1] <= 4, op,
             f"'weight' must be [{c}, kernel_size] with kernel_size in [2, 4]")
    _require(bias is None or tuple(bias.shape) == (c,), op, f"'bias' must be a 1-D tensor of {c} entries")
    w = weight.shape[1]
    _require(conv_state.dim() == 3 and tuple(conv_state.shape[1:]) == (c, w - 1), op,
             f"'conv_state' must be [num_slots, {c}, {w - 1}] (slots, channels, kernel_size - 1)")
    _require(state_slots.dtype == torch.int32 and state_slots.dim() == 1, op,
             "'state_slots' must be a 1-D int32 tensor")
    return activation is not None


def causal_conv1d_update(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         conv_state: torch.Tensor, state_slots: torch.Tensor, *, activation: str | None = "silu",
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode: one new input per sequence (``x`` [B, C]) convolved with its slot's conv state
    (``weight`` [C, W], optional ``bias``, then ``activation``); the state shifts by one."""
    op = "causal_conv1d_update"
    silu = _check_conv(op, x, weight, bias, conv_state, state_slots, activation)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if _use_cuda(op, x):
        from vllm_volta import _custom_ops
        _custom_ops.causal_conv1d_update(out, x, weight, bias, conv_state, state_slots, silu)
        return out
    _require(state_slots.shape[0] == x.shape[0], op,
             f"'state_slots' must have one entry per token row of 'x' ({x.shape[0]}), got {state_slots.shape[0]}")
    qsl = torch.arange(x.shape[0] + 1, dtype=torch.int32)
    ref.causal_conv1d(x, weight, bias, conv_state, state_slots, qsl, None, silu, out)
    return out


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                     query_start_loc: torch.Tensor, state_slots: torch.Tensor,
                     has_initial_state: torch.Tensor | None = None, *, activation: str | None = "silu",
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Varlen prefill: each sequence of ``x`` [N, C] continues from its slot's conv state (or
    zeros), and the last W - 1 inputs of state ++ sequence become the slot's state."""
    op = "causal_conv1d_fn"
    silu = _check_conv(op, x, weight, bias, conv_state, state_slots, activation)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if _use_cuda(op, x):
        from vllm_volta import _custom_ops
        _custom_ops.causal_conv1d_fn(out, x, weight, bias, conv_state, query_start_loc, state_slots,
                                     has_initial_state, silu)
        return out
    _check_varlen(op, state_slots, query_start_loc, has_initial_state)
    ref.causal_conv1d(x, weight, bias, conv_state, state_slots, query_start_loc, has_initial_state, silu, out)
    return out


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm before out_proj over ``x`` [N, heads * dim] (contiguous) and ``gate`` [N, heads * dim]
    (rows may be strided): each head's ``dim`` entries normalized, times ``weight`` [dim], times
    silu(gate), as transformers' RMSNormGated. One kernel on a GPU; PyTorch ops elsewhere."""
    op = "gated_rms_norm"
    dim = weight.shape[0]
    _require(x.dim() == 2 and x.shape == gate.shape and x.shape[1] % dim == 0, op,
             f"'x' and 'gate' must be [tokens, heads * {dim}] alike, got {tuple(x.shape)} and {tuple(gate.shape)}")
    if _use_cuda(op, x):
        from vllm_volta import _custom_ops
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _custom_ops.gated_rms_norm(out, x, gate, weight, eps)
        return out
    from vllm_volta.model_executor.layers.fla_ops import gated_rms_norm as torch_gated_rms_norm
    return torch_gated_rms_norm(x.reshape(-1, dim), gate.reshape(-1, dim), weight, eps).view(x.shape)
