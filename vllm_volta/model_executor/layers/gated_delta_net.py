"""Gated DeltaNet: the linear-attention token mixer of Qwen3-Next and Qwen3.5.

    x -> in_proj -> (q, k, v | z | b, a)
    (q, k, v) -> causal depthwise conv1d (kernel K) + SiLU -> L2-normalised q, k (q / sqrt(Dk))
    beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)      (g in float32)
    o = gated delta rule(q, k, v, g, beta) from the sequence's saved state (fla_ops)
    out_proj(gated_rms_norm(o, z))

Value heads outnumber key heads: value head j reads key head j // (num_v_heads / num_k_heads).
With tensor parallelism every rank holds a contiguous block of key heads and the value heads
that read them (projection rows, conv channels, A_log, dt_bias); out_proj sums the ranks.

The conv and the delta rule run as the CUDA kernels of layers/gdn_ops.py where the input is on a
GPU and the build has them (gates fused in the kernel, no host sync), else as the PyTorch ops of
fla_ops (decode steps batched; prefills one sequence at a time, the delta rule in chunks of 64).

State per request (one slot of each tensor, kv_cache_spec.MambaSpec):
- conv state [conv_dim, K - 1], model dtype: the last K - 1 conv inputs of each channel
  (channels are q, then k, then v, this rank's);
- recurrent state [num_v_heads, head_k_dim, head_v_dim], float32 unless the config's
  ``mamba_ssm_dtype`` says otherwise: S with o = S^T q (keys index rows).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.core.kv_cache_spec import MambaSpec
from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers import fla_ops, gdn_ops
from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, RowParallelLinear,
                                                     copy_weight, take_shard)
from vllm_volta.model_executor.layers.quantization import current_quant_config
from vllm_volta.model_executor.layers.parallel_state import (divide, get_tensor_model_parallel_rank,
                                                             get_tensor_model_parallel_world_size)

logger = init_logger(__name__)

_STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def ssm_state_dtype(config: Any) -> torch.dtype:
    """The recurrent state's dtype: the config's ``mamba_ssm_dtype`` (a string or a dtype),
    float32 when it has none."""
    value = getattr(config, "mamba_ssm_dtype", None)
    if value is None or value == "auto":
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in _STATE_DTYPES:
        raise ValueError(f"mamba_ssm_dtype must be one of {', '.join(_STATE_DTYPES)}, got {value!r}")
    return _STATE_DTYPES[name]


class GatedDeltaNet(nn.Module):
    """``forward(x [T, hidden], (conv_state, ssm_state), attn_metadata) -> [T, hidden]``.

    Parameters: ``in_proj_qkvz`` (rows q | k | v | z), ``in_proj_ba`` (rows b | a),
    ``conv_weight`` [conv_dim, K], ``A_log``, ``dt_bias``, ``norm_weight`` [head_v_dim] and
    ``out_proj``; checkpoints of either layout load through ``load_hf_weight``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        if current_quant_config() is not None:
            raise ValueError("quantization_config: quantized Gated DeltaNet (Qwen3.5 / Qwen3-Next) models are "
                             "not supported")
        act = getattr(config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act must be 'silu' for Gated DeltaNet layers, got {act!r}")
        tp = get_tensor_model_parallel_world_size()
        self.tp_rank, self.tp_size = get_tensor_model_parallel_rank(), tp
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.total_k_heads, self.total_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.num_k_heads = divide(self.total_k_heads, tp, "linear_num_key_heads")
        self.num_v_heads = divide(self.total_v_heads, tp, "linear_num_value_heads")
        if self.total_v_heads % self.total_k_heads:
            raise ValueError(f"linear_num_value_heads ({self.total_v_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.total_k_heads})")
        self.kernel_size = config.linear_conv_kernel_dim
        if self.kernel_size < 1:
            raise ValueError(f"linear_conv_kernel_dim must be >= 1, got {self.kernel_size}")
        self.eps = config.rms_norm_eps
        key_dim, value_dim = self.total_k_heads * self.head_k_dim, self.total_v_heads * self.head_v_dim
        # this rank's q | k | v widths: the conv's channels
        self.split = [self.num_k_heads * self.head_k_dim] * 2 + [self.num_v_heads * self.head_v_dim]
        self.conv_dim = sum(self.split)
        hidden = config.hidden_size
        self.in_proj_qkvz = MergedColumnParallelLinear(hidden, [key_dim, key_dim, value_dim, value_dim])
        self.in_proj_ba = MergedColumnParallelLinear(hidden, [self.total_v_heads] * 2)
        dtype = torch.get_default_dtype()
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, self.kernel_size, dtype=dtype),
                                        requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=dtype), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads, dtype=dtype), requires_grad=False)
        self.norm_weight = nn.Parameter(torch.ones(self.head_v_dim, dtype=dtype), requires_grad=False)
        self.out_proj = RowParallelLinear(value_dim, hidden)
        self.state_dtype = ssm_state_dtype(config)
        self._seen_parts: dict[str, set[int]] = {}  # fused projections' loaded shards
        # None: the CUDA kernels (layers/gdn_ops.py) where the input is on a GPU and the build
        # has them, else the PyTorch ops (fla_ops); True / False force one (tests).
        self.use_kernels: bool | None = None

    def state_spec(self, dtype: torch.dtype) -> MambaSpec:
        """This rank's per-request state: (conv state, recurrent state), conv in ``dtype``."""
        return MambaSpec(shapes=((self.conv_dim, self.kernel_size - 1),
                                 (self.num_v_heads, self.head_k_dim, self.head_v_dim)),
                         dtypes=(dtype, self.state_dtype))

    # ---- forward ----------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        md = attn_metadata
        if md.state_slots is None:
            raise ValueError("attn_metadata.state_slots is required by Gated DeltaNet layers "
                             "(one recurrent-state slot per sequence)")
        qkvz = self.in_proj_qkvz(x)
        mixed, z = qkvz.split([self.conv_dim, self.num_v_heads * self.head_v_dim], dim=-1)
        b, a = self.in_proj_ba(x).split(self.num_v_heads, dim=-1)
        if self._use_kernels(x):
            core = self._forward_kernels(mixed, a, b, state, md)
            out = gdn_ops.gated_rms_norm(core.to(x.dtype).view(x.shape[0], -1), z, self.norm_weight, self.eps)
        else:
            core = self._forward_torch(mixed, a, b, state, md)
            out = fla_ops.gated_rms_norm(core.to(x.dtype).view(-1, self.head_v_dim),
                                         z.reshape(-1, self.head_v_dim), self.norm_weight, self.eps)
        return self.out_proj(out.view(x.shape[0], -1))

    def _use_kernels(self, x: torch.Tensor) -> bool:
        if self.use_kernels is not None:
            return self.use_kernels
        if not x.is_cuda:
            info_once(logger, "Gated DeltaNet layers: PyTorch ops on %s", x.device.type)
            return False
        from vllm_volta import _custom_ops
        found = all(_custom_ops.has_cuda_kernel(op) for op in ("causal_conv1d_fn", "gated_delta_rule_prefill"))
        info_once(logger, "Gated DeltaNet layers: %s", "the CUDA kernels (gdn_ops)" if found
                  else "PyTorch ops on the GPU (this build has no Gated DeltaNet kernels)")
        return found

    def _forward_kernels(self, mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                         state: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata) -> torch.Tensor:
        """The conv and the delta rule through layers/gdn_ops.py (gates fused in the kernel):
        the varlen ops for every step, as they take has_initial_state (a new sequence never reads
        its slot); no host sync."""
        conv_state, ssm_state = state
        qsl, n = md.query_start_loc, mixed.shape[0]
        continues = (md.seq_lens - (qsl[1:] - qsl[:-1])) > 0
        # The kernels read strided token rows: the projections' column slices go in uncopied.
        conv_out = gdn_ops.causal_conv1d_fn(mixed, self.conv_weight, None, conv_state, qsl,
                                            md.state_slots, continues, activation="silu")
        q, k, v = conv_out.split(self.split, dim=-1)
        return gdn_ops.gated_delta_rule_prefill(
            q.view(n, self.num_k_heads, self.head_k_dim), k.view(n, self.num_k_heads, self.head_k_dim),
            v.view(n, self.num_v_heads, self.head_v_dim), a, b, ssm_state,
            md.state_slots, qsl, continues, A_log=self.A_log, dt_bias=self.dt_bias, qk_l2norm=True)

    def _forward_torch(self, mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       state: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata) -> torch.Tensor:
        """The PyTorch ops (fla_ops): decode steps batched, prefills one sequence at a time."""
        beta = torch.sigmoid(b).float()  # in the model dtype, then float32 (as transformers)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        core = torch.zeros(mixed.shape[0], self.num_v_heads, self.head_v_dim, dtype=torch.float32,
                           device=mixed.device)
        if md.max_query_len <= 1:
            # Decode: token i is sequence i; batched, no host sync.
            seqs = torch.arange(md.state_slots.shape[0], device=mixed.device)
            self._decode(seqs, seqs, mixed, beta, g, state, md, core)
        else:
            self._mixed(mixed, beta, g, state, md, core)
        return core

    def _qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv outputs [N, conv_dim] -> q, k [N, Hv, Dk] (normalised, q scaled), v [N, Hv, Dv],
        float32; each key head repeated for the value heads that read it."""
        q, k, v = mixed.float().split(self.split, dim=-1)
        n, group = mixed.shape[0], self.num_v_heads // self.num_k_heads
        q = fla_ops.l2_normalize(q.view(n, self.num_k_heads, self.head_k_dim)) * self.head_k_dim ** -0.5
        k = fla_ops.l2_normalize(k.view(n, self.num_k_heads, self.head_k_dim))
        if group > 1:
            q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        return q, k, v.view(n, self.num_v_heads, self.head_v_dim)

    def _decode(self, seqs: torch.Tensor, tokens: torch.Tensor, mixed: torch.Tensor, beta: torch.Tensor,
                g: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata,
                core: torch.Tensor) -> None:
        """One new token for each of ``seqs`` (its row ``tokens``): gather the slots' states
        (zeros for sequences without computed tokens: a slot's old contents are never read),
        step, scatter back."""
        conv_state, ssm_state = state
        slots = md.state_slots.long()[seqs]
        query_lens = md.query_start_loc[1:] - md.query_start_loc[:-1]
        continues = (md.seq_lens - query_lens)[seqs] > 0
        old_conv = torch.where(continues[:, None, None], conv_state[slots], 0)
        conv_out, new_conv = fla_ops.causal_conv1d_step(mixed[tokens], self.conv_weight, None, old_conv)
        conv_state[slots] = new_conv.to(conv_state.dtype)
        q, k, v = self._qkv(F.silu(conv_out))
        old = torch.where(continues[:, None, None, None], ssm_state[slots].float(), 0)
        o, new = fla_ops.gated_delta_rule_step(q, k, v, g[tokens], beta[tokens], old)
        ssm_state[slots] = new.to(ssm_state.dtype)
        core[tokens] = o

    def _mixed(self, mixed: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
               state: tuple[torch.Tensor, torch.Tensor], md: AttentionMetadata, core: torch.Tensor) -> None:
        """Prefill chunks one sequence at a time (chunked delta rule); the single-token
        sequences of the batch together, as in decode."""
        conv_state, ssm_state = state
        starts = md.query_start_loc_cpu.tolist()
        seq_lens = md.seq_lens_cpu.tolist()
        slots = md.state_slots.tolist()  # one host sync per layer in mixed steps only
        singles = []
        for i, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
            if hi - lo == 1:
                singles.append(i)
            elif hi > lo:
                continues = seq_lens[i] > hi - lo
                slot = slots[i]
                conv_out, new_conv = fla_ops.causal_conv1d(
                    mixed[lo:hi], self.conv_weight, None, conv_state[slot] if continues else None)
                conv_state[slot] = new_conv.to(conv_state.dtype)
                q, k, v = self._qkv(F.silu(conv_out))
                o, new = fla_ops.chunk_gated_delta_rule(q, k, v, g[lo:hi], beta[lo:hi],
                                                        ssm_state[slot].float() if continues else None)
                ssm_state[slot] = new.to(ssm_state.dtype)
                core[lo:hi] = o
        if singles:
            seqs = torch.tensor(singles, device=mixed.device)
            tokens = torch.tensor([starts[i] for i in singles], device=mixed.device)
            self._decode(seqs, tokens, mixed, beta, g, state, md, core)

    # ---- weights ----------------------------------------------------------------------------

    def load_hf_weight(self, name: str, tensor: torch.Tensor) -> list[str]:
        """One checkpoint tensor, ``name`` relative to the layer (Qwen3.5: in_proj_qkv, in_proj_z,
        in_proj_b, in_proj_a; Qwen3-Next: in_proj_qkvz and in_proj_ba packed per key head; both:
        conv1d.weight, A_log, dt_bias, norm.weight, out_proj.weight). Returns the names of the
        parameters it completed (the fused projections once each of their parts came)."""
        dk, dv, nk = self.head_k_dim, self.head_v_dim, self.total_k_heads
        group = self.total_v_heads // nk
        qkvz, ba = "in_proj_qkvz.weight", "in_proj_ba.weight"
        if name == "in_proj_qkv.weight":
            q, k, v = _split_rows(tensor, [nk * dk, nk * dk, self.total_v_heads * dv], name)
            return self._load_parts(qkvz, {0: q, 1: k, 2: v})
        if name == "in_proj_z.weight":
            return self._load_parts(qkvz, {3: tensor})
        if name in ("in_proj_b.weight", "in_proj_a.weight"):
            return self._load_parts(ba, {0 if name == "in_proj_b.weight" else 1: tensor})
        if name == qkvz:
            # rows per key head: [q (Dk), k (Dk), v (group*Dv), z (group*Dv)]
            hidden = tensor.shape[-1]
            per_head = _split_rows(tensor, [nk * (2 * dk + 2 * group * dv)], name)[0].reshape(nk, -1, hidden)
            parts = per_head.split([dk, dk, group * dv, group * dv], dim=1)
            return self._load_parts(qkvz, {i: p.reshape(-1, hidden) for i, p in enumerate(parts)})
        if name == ba:
            hidden = tensor.shape[-1]
            b, a = _split_rows(tensor, [2 * self.total_v_heads], name)[0].reshape(nk, 2 * group, hidden).split(group, 1)
            return self._load_parts(ba, {0: b.reshape(-1, hidden), 1: a.reshape(-1, hidden)})
        if name == "conv1d.weight":
            pieces = _split_rows(tensor.reshape(tensor.shape[0], -1), [n * self.tp_size for n in self.split], name)
            local = [p.narrow(0, self.tp_rank * n, n) for p, n in zip(pieces, self.split)]
            copy_weight(self.conv_weight.data, torch.cat(local, dim=0))
            return ["conv_weight"]
        if name in ("A_log", "dt_bias"):
            param = getattr(self, name)
            n = self.num_v_heads
            copy_weight(param.data, take_shard(tensor, 0, self.tp_rank, n, n * self.tp_size))
            return [name]
        if name == "norm.weight":
            copy_weight(self.norm_weight.data, tensor)
            return ["norm_weight"]
        if name == "out_proj.weight":
            self.out_proj.weight_loader(self.out_proj.weight, tensor)
            return ["out_proj.weight"]
        raise ValueError(f"checkpoint weight {name!r} does not belong to a Gated DeltaNet layer")

    def _load_parts(self, param_name: str, parts: dict[int, torch.Tensor]) -> list[str]:
        """Shards of a fused projection; the name once all of its shards were loaded."""
        layer = self.get_submodule(param_name.removesuffix(".weight"))
        for shard_id, part in parts.items():
            layer.weight_loader(layer.weight, part, shard_id)
        seen = self._seen_parts.setdefault(param_name, set())
        seen.update(parts)
        return [param_name] if len(seen) == len(layer.output_sizes) else []


def _split_rows(tensor: torch.Tensor, sizes: list[int], name: str) -> tuple[torch.Tensor, ...]:
    """``tensor`` split along dim 0 into ``sizes`` after checking it has that many rows."""
    if tensor.dim() < 2 or tensor.shape[0] != sum(sizes):
        raise ValueError(f"checkpoint weight {name!r} has shape {tuple(tensor.shape)}, expected "
                         f"{sum(sizes)} rows")
    return tensor.split(sizes, dim=0)
