"""VOLTA_PAGED: CUDA paged attention that is fast on SM70+ (V100, T4) and runs on newer GPUs.

- KV-cache write: the fused ``reshape_and_cache`` kernel (``write_to_kv_cache`` on the impl).
- Decode (one new token per sequence): ``paged_attention_decode``, a Volta-safe CUDA kernel
  (FP16 with 16-byte loads, fp32 math, the context split into partitions and combined by a
  second kernel). Its grid depends only on ``max_seq_len``, so a pure-decode step is
  capturable in a CUDA graph. Launch parameters come from the tuned kernel configs.
- Prefill (and chunked prefill / prefix-cache hits): tensor cores, variable-length sequences
  with a bottom-right causal mask (new token j of a sequence sees the cached prefix and the new
  tokens up to itself). On SM80+ in fp16/bf16 through FlashAttention
  (``aten._flash_attention_forward``: grouped-query heads natively), else, as on SM70/75,
  through PyTorch's memory-efficient attention (``aten._efficient_attention_forward``, with the
  kv heads repeated per query head, a slice of KV heads at a time past _PREFILL_REPEAT_BYTES, so a
  long context's copies stay bounded). Neither kernel holds [query x context] scores. Sequences
  with a cached prefix run as one call over their whole contexts, gathered from the cache; the
  others as another, over the step's new keys/values as they are. Rows that lie back to back in the step (the usual layout: decodes
  first, then the prefills) are used as slices, not gathered and scattered.
- Sliding windows run in every kernel (FlashAttention's ``window_size_left``, the
  memory-efficient kernel's ``window_size``, the decode kernel's window start). Logit soft-capping
  (Gemma 2) runs in the decode kernel; its prefill, which neither ATen kernel can do, runs per
  sequence as matmuls with the cap in between (attention/explicit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm_volta.attention.backends import AttentionImplBase
from vllm_volta.attention.backends.paged_decode_launch import (  # noqa: F401 (heads_per_block: re-exported)
    context_bucket, default_launch_config, heads_per_block)
from vllm_volta.attention.explicit import soft_capped_prefill
from vllm_volta.attention.kv_cache_dtype import is_fp8, read_cache
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.host_copy import to_device
from vllm_volta.logger import info_once, init_logger

if TYPE_CHECKING:
    from vllm_volta.platforms.interface import DeviceCapability

SUPPORTED_HEAD_SIZES = (64, 96, 128, 256, 512)
_SUPPORTED_DTYPES = (torch.float16, torch.float32, torch.bfloat16)
_LAUNCH_KEYS = ("partition_size", "num_threads")
_BOTTOM_RIGHT_CAUSAL = 2  # custom_mask_type of _efficient_attention_forward
# The memory-efficient prefill repeats each KV head per query head; past this many bytes of
# repeated keys + values (a long context: 2 GiB for 8 of 32 heads of 128 at 128k tokens), it runs
# in slices of KV heads, so the copies stay near this size whatever the context.
_PREFILL_REPEAT_BYTES = 256 << 20

logger = init_logger(__name__)


def choose_prefill_kernel(capability: DeviceCapability | None, dtype: torch.dtype,
                          head_size: int = 128) -> tuple[str, str]:
    """("flash" or "efficient", why) for prefill attention on a device of `capability`."""
    if head_size > 256:
        return "efficient", f"head size {head_size} is above FlashAttention's 256"
    if capability is None or capability.major < 8:
        return "efficient", f"compute capability {capability} is below 8.0 (FlashAttention needs SM80+)"
    if dtype not in (torch.float16, torch.bfloat16):
        return "efficient", f"FlashAttention runs fp16/bf16 only, the dtype is {dtype}"
    if not torch.backends.cuda.is_flash_attention_available():
        return "efficient", "this torch build has no FlashAttention kernels"
    return "flash", f"compute capability {capability} with {dtype}"


def repeat_heads(x: torch.Tensor, times: int) -> torch.Tensor:
    """[T, H, D] -> [T, H * times, D], each head `times` times in a row (``repeat_interleave``
    on dim 1). ATen copies a broadcast view element by element, so the copy moves 8-byte words
    where the layout allows (a quarter of the elements for fp16) instead of single entries."""
    t, h, d = x.shape
    per_word = 8 // x.element_size()
    if (x.stride(2) == 1 and d % per_word == 0 and x.storage_offset() % per_word == 0
            and x.stride(0) % per_word == 0 and x.stride(1) % per_word == 0):
        words = x.view(torch.int64).unsqueeze(2).expand(t, h, times, d // per_word)
        return words.reshape(t, h * times, d // per_word).view(x.dtype)
    return x.repeat_interleave(times, dim=1)


def _extension_problem() -> str | None:
    """Why the CUDA kernels of vllm_volta._C cannot be used, or None."""
    try:
        from vllm_volta._custom_ops import has_cuda_kernel
    except ImportError as e:
        return f"vllm_volta._C cannot be imported ({e})"
    if not has_cuda_kernel("paged_attention_decode"):
        return "vllm_volta._C was built without CUDA kernels (reinstall with a CUDA build of torch)"
    return None


class VoltaPagedBackend:
    """Backend class: selection checks plus the impl class (contract in docs/ARCHITECTURE.md)."""

    name = "VOLTA_PAGED"
    supports_cuda_graphs = True  # pure-decode steps: no host sync, grid from max_seq_len

    @staticmethod
    def validate(*, capability: DeviceCapability | None, dtype: torch.dtype, head_size: int,
                 device_type: str) -> list[str]:
        """Reasons this backend cannot run in the given setting (empty list = it can)."""
        reasons = []
        if device_type != "cuda":
            reasons.append(f"needs a CUDA device, got {device_type!r}")
        if capability is not None and capability.major < 7:
            reasons.append(f"needs compute capability >= 7.0, got {capability.major}.{capability.minor}")
        if dtype not in _SUPPORTED_DTYPES:
            reasons.append(f"dtype {dtype} is not one of float16, float32, bfloat16")
        elif dtype == torch.bfloat16 and capability is not None and capability.major < 8:
            reasons.append(f"bfloat16 needs compute capability >= 8.0, "
                           f"got {capability.major}.{capability.minor}")
        if head_size not in SUPPORTED_HEAD_SIZES:
            reasons.append(f"head_size {head_size} is not supported (supported: "
                           f"{', '.join(map(str, SUPPORTED_HEAD_SIZES))})")
        if device_type == "cuda" and (problem := _extension_problem()) is not None:
            reasons.append(problem)
        elif device_type == "cuda" and dtype == torch.bfloat16:
            from vllm_volta._custom_ops import cuda_bf16_kernels_built

            if not cuda_bf16_kernels_built():
                reasons.append("bfloat16 kernels are not built (every arch in TORCH_CUDA_ARCH_LIST is below 8.0)")
        return reasons

    @staticmethod
    def get_impl_cls() -> type[VoltaPagedImpl]:
        return VoltaPagedImpl


Rows = slice | torch.Tensor  # a step's rows: a slice when back to back, else token indices


@dataclass
class _PrefillPart:
    """Prefill sequences that run as one variable-length attention call."""

    rows: Rows  # their new tokens
    cu_seqlens_q: torch.Tensor  # [N + 1] int32
    cu_seqlens_k: torch.Tensor  # [N + 1] int32 (the same tensor when nothing is cached)
    max_q: int
    max_k: int
    context_slots: torch.Tensor | None  # [sum seq_len] cache slots of whole contexts (prefix hit)
    q_lens: list[int]  # per sequence (host side, for the per-sequence soft-capped prefill)
    k_lens: list[int]


@dataclass
class _MixedPlan:
    """How a step with prefills splits into kernels; built once per metadata, shared by layers."""

    decode_rows: Rows | None  # the sequences with one new token (sequence i's row is token i)
    decode_block_table: torch.Tensor | None
    decode_seq_lens: torch.Tensor | None
    decode_max_len: int
    # Sequences with a cached prefix (their keys/values gathered from the cache), then those
    # without (the step's new keys/values as they are): a step of fresh prompts and one
    # continued chunk gathers only that chunk's context.
    prefills: list[_PrefillPart]


def _build_plan(md: AttentionMetadata, block_size: int) -> _MixedPlan:
    device = md.block_table.device
    starts = md.query_start_loc_cpu.tolist()
    seq_lens = md.seq_lens_cpu.tolist()
    q_lens = [starts[i + 1] - starts[i] for i in range(len(seq_lens))]

    def on_device(values: Any, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return to_device(values, device, dtype)

    def consecutive(seqs: list[int]) -> bool:
        return seqs[-1] - seqs[0] + 1 == len(seqs)

    def token_rows(seqs: list[int]) -> Rows:
        """The new tokens of `seqs`: back to back exactly when the sequences are consecutive."""
        if consecutive(seqs):
            return slice(starts[seqs[0]], starts[seqs[-1] + 1])
        return on_device([t for i in seqs for t in range(starts[i], starts[i + 1])])

    def prefill_part(seqs: list[int]) -> _PrefillPart:
        p_q = [q_lens[i] for i in seqs]
        p_k = [seq_lens[i] for i in seqs]
        cu_q = on_device(np.cumsum([0] + p_q), torch.int32)
        part = _PrefillPart(token_rows(seqs), cu_q, cu_q, max(p_q), max(p_k), None, p_q, p_k)
        if p_k != p_q:
            part.cu_seqlens_k = on_device(np.cumsum([0] + p_k), torch.int32)
            seq_of = on_device(np.repeat(seqs, p_k))
            pos = on_device(np.concatenate([np.arange(n) for n in p_k]))
            part.context_slots = md.block_table[seq_of, pos // block_size].long() * block_size + pos % block_size
        return part

    plan = _MixedPlan(None, None, None, 0, [])
    decodes = [i for i, n in enumerate(q_lens) if n == 1]
    if decodes:
        seqs = slice(decodes[0], decodes[-1] + 1) if consecutive(decodes) else on_device(decodes)
        plan.decode_rows = token_rows(decodes)
        plan.decode_block_table = md.block_table[seqs]
        plan.decode_seq_lens = md.seq_lens[seqs]
        plan.decode_max_len = max(seq_lens[i] for i in decodes)
    cached = [i for i, n in enumerate(q_lens) if n > 1 and seq_lens[i] > n]
    fresh = [i for i, n in enumerate(q_lens) if n > 1 and seq_lens[i] == n]
    plan.prefills = [prefill_part(group) for group in (cached, fresh) if group]
    return plan


class VoltaPagedImpl(AttentionImplBase):
    """Paged attention with the _C CUDA kernels (decode) and memory-efficient attention (prefill)."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, *,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, sliding_window=sliding_window,
                         logits_soft_cap=logits_soft_cap)
        self._launch_configs: dict[tuple[int, int, torch.dtype], dict[str, Any]] = {}
        self.prefill_kernel: str | None = None  # "flash" / "efficient", chosen at the first prefill

    def write_to_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        """Fused cache write (slots of -1 are skipped; an FP8 cache gets key / k_scale and
        value / v_scale); called by the Attention layer."""
        from vllm_volta import _custom_ops as ops

        ops.reshape_and_cache(key, value, kv_cache, slot_mapping, k_scale, v_scale)

    def rope_and_write_to_kv_cache(self, rotary_emb: Any, positions: torch.Tensor, query: torch.Tensor,
                                   key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                                   slot_mapping: torch.Tensor) -> None:
        """RoPE on query/key (in place) and the cache write, in one kernel (one slot per token);
        called by the Attention layer. An FP8 cache: RoPE in place, then the quantizing write."""
        from vllm_volta import _custom_ops as ops

        if is_fp8(kv_cache.dtype):
            ops.rotary_embedding(positions, query, key, rotary_emb.head_size, rotary_emb.cos_sin_cache,
                                 rotary_emb.is_neox_style)
            ops.reshape_and_cache(key, value, kv_cache, slot_mapping, self.k_scale, self.v_scale)
            return
        ops.rotary_embedding_and_cache(positions, query, key, value, kv_cache, slot_mapping, rotary_emb.head_size,
                                       rotary_emb.cos_sin_cache, rotary_emb.is_neox_style)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """query [T, H*D] -> [T, H*D]; the new key/value are already in ``kv_cache``."""
        md = attn_metadata
        num_tokens = md.num_actual_tokens
        h, d = self.num_heads, self.head_size
        output = torch.empty_like(query)
        if query.shape[0] > num_tokens:  # padding rows
            output[num_tokens:].zero_()
        q = query[:num_tokens].view(num_tokens, h, d)
        out = output[:num_tokens].view(num_tokens, h, d)
        if num_tokens == 0:
            return output
        if md.max_query_len == 1 and num_tokens == md.seq_lens.shape[0]:
            # Pure decode, token i = sequence i: no host-side work (CUDA-graph capturable).
            self._decode(out, q, kv_cache, md.block_table, md.seq_lens, md.max_seq_len)
            return output
        plan = md.step_cached("volta_paged", lambda: _build_plan(md, kv_cache.shape[2]))
        rows = plan.decode_rows
        if rows is not None:
            in_place = isinstance(rows, slice)  # a view of the output; else gathered rows
            dec_out = out[rows] if in_place else torch.empty(rows.shape[0], h, d, dtype=query.dtype,
                                                             device=query.device)
            self._decode(dec_out, q[rows], kv_cache, plan.decode_block_table, plan.decode_seq_lens,
                         plan.decode_max_len)
            if not in_place:
                out[rows] = dec_out
        for part in plan.prefills:
            result = self._prefill(q, key, value, kv_cache, part)
            if isinstance(part.rows, slice) and part.rows == slice(0, query.shape[0]):  # the whole step
                return result.view(query.shape)
            out[part.rows] = result
        return output

    def _launch_config(self, num_seqs: int, max_seq_len: int, dtype: torch.dtype,
                       device: torch.device) -> dict[str, Any]:
        """(partition_size, num_threads) for a decode launch whose grid spans ``max_seq_len``.

        Looked up by batch size and context (tuned table, else default_launch_config), cached
        per (batch, quarter-octave context bucket) so the host cost is one dict lookup. A CUDA
        graph bakes in the launch of its capture, where max_seq_len is the graph's bound
        (max_model_len, capped by max_seq_len_to_capture): its replays keep the launch for that
        longest context, and the partitions past a sequence's end exit at once. That favours long
        contexts (the attention is a large share of the step there, and too many short partitions
        cost reduce work); a short context in a long graph only runs on fewer blocks.
        """
        span = max_seq_len if self.sliding_window is None else min(max_seq_len, self.sliding_window)
        key = (num_seqs, context_bucket(span), dtype)
        cfg = self._launch_configs.get(key)
        if cfg is None:
            from vllm_volta.kernel_configs import get_kernel_config

            sms = torch.cuda.get_device_properties(device).multi_processor_count
            default = default_launch_config(num_seqs, self.num_heads, self.num_kv_heads, sms, key[1])
            cfg = get_kernel_config("paged_attention_decode", num_seqs, default=default, context_len=key[1],
                                    head_size=self.head_size, num_kv_heads=self.num_kv_heads, dtype=dtype)
            cfg = self._launch_configs[key] = {k: int(cfg[k]) for k in _LAUNCH_KEYS}
            logger.debug("VOLTA_PAGED decode launch for batch %d, context <= %d (%s): %s", num_seqs, key[1],
                         dtype, cfg)
        return cfg

    def _decode(self, out: torch.Tensor, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor, max_seq_len: int) -> None:
        from vllm_volta import _custom_ops as ops

        ops.paged_attention_decode(out, q, kv_cache, block_table, seq_lens, self.scale, max_seq_len,
                                   **self._launch_config(q.shape[0], max_seq_len, q.dtype, q.device),
                                   sliding_window=self.sliding_window, logits_soft_cap=self.logits_soft_cap,
                                   k_scale=self.k_scale, v_scale=self.v_scale)

    def _prefill(self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 part: _PrefillPart) -> torch.Tensor:
        """The part's rows of q [T, H, D], attending to their keys/values -> [rows, H, D]."""
        kh, d = self.num_kv_heads, self.head_size
        if part.context_slots is None:  # nothing cached: the step's new keys/values
            k, v = key[part.rows].view(-1, kh, d), value[part.rows].view(-1, kh, d)
        else:  # the whole context (cached prefix + new tokens) from the cache
            k = kv_cache[0].view(-1, kh, d)[part.context_slots]
            v = kv_cache[1].view(-1, kh, d)[part.context_slots]
        q = q[part.rows]
        # An FP8 cache is dequantized (value times its scale) as it is read.
        k, v = read_cache(k, self.k_scale, q.dtype), read_cache(v, self.v_scale, q.dtype)
        window = self.sliding_window
        if self._prefill_kernel(q) == "flash" and self.logits_soft_cap is None:
            # A window of w keys: w - 1 to the left of the diagonal, none to the right.
            return torch.ops.aten._flash_attention_forward(
                q, k, v, part.cu_seqlens_q, part.cu_seqlens_k, part.max_q, part.max_k, 0.0, True, False,
                scale=self.scale, window_size_left=None if window is None else window - 1,
                window_size_right=None if window is None else 0)[0]
        group = self.num_queries_per_kv
        if group == 1:
            return (self._efficient_prefill(q, k, v, part) if self.logits_soft_cap is None
                    else self._soft_capped_prefill(q, k, v, part))
        if self.logits_soft_cap is not None:
            return self._soft_capped_prefill(q, repeat_heads(k, group), repeat_heads(v, group), part)
        # The kernel wants one KV head per query head: repeat them, a slice of KV heads at a time
        # where the whole context repeated would pass _PREFILL_REPEAT_BYTES.
        per_kv_head = 2 * k.shape[0] * group * d * k.element_size()
        step = max(1, min(kh, _PREFILL_REPEAT_BYTES // per_kv_head))
        if step == kh:
            return self._efficient_prefill(q, repeat_heads(k, group), repeat_heads(v, group), part)
        out = torch.empty_like(q)
        for h0 in range(0, kh, step):
            h1 = min(kh, h0 + step)
            heads = slice(h0 * group, h1 * group)
            out[:, heads] = self._efficient_prefill(q[:, heads].contiguous(), repeat_heads(k[:, h0:h1], group),
                                                    repeat_heads(v[:, h0:h1], group), part)
        return out

    def _efficient_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           part: _PrefillPart) -> torch.Tensor:
        """Memory-efficient attention of q [rows, H', D] over k / v [keys, H', D] (one KV head per
        query head), bottom-right causal per sequence, within the window."""
        out = torch.ops.aten._efficient_attention_forward(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None,
            part.cu_seqlens_q, part.cu_seqlens_k, part.max_q, part.max_k, 0.0, _BOTTOM_RIGHT_CAUSAL,
            False, scale=self.scale, window_size=self.sliding_window)[0]
        return out.squeeze(0)

    def _soft_capped_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             part: _PrefillPart) -> torch.Tensor:
        out = torch.empty_like(q)
        q_start = k_start = 0
        for q_len, k_len in zip(part.q_lens, part.k_lens):
            out[q_start:q_start + q_len] = soft_capped_prefill(
                q[q_start:q_start + q_len], k[k_start:k_start + k_len], v[k_start:k_start + k_len],
                self.scale, self.logits_soft_cap, self.sliding_window)
            q_start, k_start = q_start + q_len, k_start + k_len
        return out

    def _prefill_kernel(self, q: torch.Tensor) -> str:
        if self.prefill_kernel is None:
            from vllm_volta.platforms import current_platform

            capability = current_platform.get_device_capability(q.device.index or 0)
            self.prefill_kernel, why = choose_prefill_kernel(capability, q.dtype, self.head_size)
            name = "FlashAttention" if self.prefill_kernel == "flash" else "memory-efficient attention"
            info_once(logger, "VOLTA_PAGED prefill: %s (%s)", name, why)
            if self.logits_soft_cap is not None:
                info_once(logger, "VOLTA_PAGED prefill of soft-capped layers: per-sequence matmuls "
                          "(neither ATen attention kernel caps the scores)")
        return self.prefill_kernel
