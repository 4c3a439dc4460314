"""Thin Python wrappers over the ops of the ``vllm_volta._C`` extension (``torch.ops._C.*``).

Importing this module loads the extension, which registers the ops with the dispatcher.
Schemas follow vLLM: output tensors first, mutated in place, nothing returned. The kernel
behind each op is chosen by the dispatcher: native CUDA kernels, the V100 adapter (CUDA
builds whose target archs are all below SM80) or the adapter functions on CPU.
"""

from __future__ import annotations

import functools
import re

import torch

try:
    import vllm_volta._C as _ext  # registers torch.ops._C.*
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "vllm_volta._C is not built; run `pip install --no-build-isolation -e .` in the repo root"
    ) from exc


@functools.cache
@functools.lru_cache(maxsize=None)
def has_cuda_kernel(op: str) -> bool:
    """Whether this build registered a CUDA kernel for ``_C::<op>`` (asked once per op: layers
    ask it every step)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{op}", "CUDA")


def v100_adapter_build() -> bool:
    """Whether the CUDA ops are the V100 adapter's ATen compositions (a CUDA build whose target
    archs are all below SM80)."""
    return bool(getattr(_ext, "V100_ADAPTER", False))


def cuda_bf16_kernels_built() -> bool:
    """Whether this build has bfloat16 CUDA kernels: a CUDA build with a target arch >= 8.0
    (below that the bf16 instances are compiled out). The V100 adapter's ops do not need them."""
    archs = [a for a in _ext.CUDA_ARCHS.split(",") if a]
    return bool(_ext.BUILT_WITH_CUDA) and any(int(re.match(r"\d+", a).group()) >= 80 for a in archs)


def programmatic_launch(device: int | torch.device) -> bool:
    """Whether the decode kernels (gemv, paged attention) go out as programmatic dependent
    launches on this CUDA device: each may then start, issuing its weight loads, while the
    kernel before it finishes. Applies to launches of 3+ rows (tokens, sequences); 1-2 row
    launches stay plain, which measured faster for batch-1 and -2 decode (csrc/cuda_launch.h).
    Needs an SM90+ GPU running an image compiled for compute_90+ (not the Volta build's PTX), no
    VLLM_VOLTA_DEVICE_CAPABILITY below 9.0, and VLLM_VOLTA_PDL not switched off; decided once
    per device and process (csrc/programmatic_launch.cu)."""
    from vllm_volta import envs
    envs.VLLM_VOLTA_PDL  # a malformed switch raises here; the kernels' side reads only on/off
    index = device.index if isinstance(device, torch.device) else device
    return bool(_ext.programmatic_launch(torch.cuda.current_device() if index is None else index))


def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    """out <- input * rsqrt(mean(input^2, -1) + epsilon), rounded to the dtype, times weight."""
    torch.ops._C.rms_norm(out, input, weight, epsilon)


def fused_add_rms_norm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> None:
    """In place: residual <- input + residual; input <- rms_norm(residual) * weight."""
    torch.ops._C.fused_add_rms_norm(input, residual, weight, epsilon)


def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """out <- silu(input[..., :d]) * input[..., d:] with d = input.shape[-1] // 2."""
    torch.ops._C.silu_and_mul(out, input)


def gelu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """out <- gelu(input[..., :d]) * input[..., d:] (exact, erf-based GELU)."""
    torch.ops._C.gelu_and_mul(out, input)


def gelu_tanh_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """out <- gelu_tanh(input[..., :d]) * input[..., d:] (tanh approximation)."""
    torch.ops._C.gelu_tanh_and_mul(out, input)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write key/value rows ([T, KH, D] or [T, KH*D]) into the paged ``kv_cache``
    ([2, num_blocks, block_size, KH, D]) at ``slot_mapping`` (int64; -1 = skip). CUDA only.
    An FP8 cache (float8_e4m3fn / float8_e5m2) gets key / k_scale and value / v_scale, rounded
    to nearest even and saturated to the format's largest finite value."""
    torch.ops._C.reshape_and_cache(key, value, kv_cache, slot_mapping, k_scale, v_scale)


def paged_attention_decode(out: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           max_seq_len: int, partition_size: int = 512, num_threads: int = 128,
                           sliding_window: int | None = None, logits_soft_cap: float | None = None,
                           k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """One query token per sequence attends to its whole cached context. CUDA only.

    ``query``/``out`` are [num_seqs, num_heads, head_size] (query rows may be strided);
    ``block_table`` [num_seqs, max_blocks] int32; ``seq_lens`` [num_seqs] int32 (context length
    including the query token, already in the cache). ``max_seq_len`` must bound every seq_len:
    the launch grid depends only on it, so a CUDA graph captured with max_model_len replays for
    any lengths. ``partition_size``/``num_threads`` are tunable launch parameters.
    ``sliding_window``: the query (at seq_len - 1) sees only the last ``sliding_window`` tokens;
    ``logits_soft_cap``: scaled scores s become cap * tanh(s / cap) (None = neither).
    An FP8 ``kv_cache`` (with float16 / bfloat16 queries) is read as its values times ``k_scale``
    (keys) and ``v_scale`` (values).
    """
    torch.ops._C.paged_attention_decode(out, query, kv_cache, block_table, seq_lens, scale,
                                        max_seq_len, partition_size, num_threads, sliding_window or 0,
                                        logits_soft_cap or 0.0, k_scale, v_scale)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotate ``query`` (and ``key``) in place by the cos/sin of each token's position. CUDA only.

    ``query``/``key`` are [T, heads * head_size] or [T, heads, head_size] (rows may be strided,
    e.g. column views of a fused qkv output); ``positions`` int64 or int32 with T elements;
    ``cos_sin_cache`` [max_position, rot_dim] (cos then sin), float32 or the query dtype.
    ``is_neox`` pairs (i, i + rot_dim/2), else (2i, 2i+1); dims past rot_dim are unchanged.
    Positions are not range-checked (that would need a device sync): a token whose position is
    outside [0, max_position) is left unchanged.
    """
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


def rotary_embedding_and_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                               head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """``rotary_embedding`` (in place on ``query``/``key``), then ``reshape_and_cache`` of the rotated
    key and ``value`` into ``kv_cache`` at ``slot_mapping``, in one kernel. CUDA only; one slot
    per token (slots of -1 are skipped); the cache in the dtype of ``query``.
    """
    torch.ops._C.rotary_embedding_and_cache(positions, query, key, value, kv_cache, slot_mapping, head_size,
                                            cos_sin_cache, is_neox)


# Per (device, stream): the sampling kernels' workspace, zeros between calls (each call leaves it
# zero again), so no clearing launch runs per step. Calls on one stream run one after another.
_sample_workspaces: dict[tuple[torch.device, int], torch.Tensor] = {}


def sample_workspace(logits: torch.Tensor) -> torch.Tensor:
    """A zeroed int64 workspace of at least 2 entries per row of ``logits`` for the current
    stream of its device, kept for later calls (grown, never shrunk)."""
    key = (logits.device, torch.cuda.current_stream(logits.device).cuda_stream)
    ws = _sample_workspaces.get(key)
    need = 2 * logits.shape[0]
    if ws is None or ws.numel() < need:
        ws = torch.zeros(max(need, 2 * 256), dtype=torch.int64, device=logits.device)
        _sample_workspaces[key] = ws
    return ws


def gumbel_sample(sampled: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor,
                  seeds: torch.Tensor, workspace: torch.Tensor | None = None, seed_offset: int = 0,
                  sampled_host: torch.Tensor | None = None) -> None:
    """``sampled[i]`` <- a draw from softmax(logits[i] / temperature[i]). CUDA only.

    One pass over the logits (any float dtype, rows may be strided): the argmax of
    logits / T plus Gumbel noise from a Philox stream keyed by ``seeds[i]`` (int64) at counter
    offset ``seed_offset`` (a 64-bit int), so a row's draw depends only on its seed, the offset
    and its logits. ``sampled`` int64 [B]; ``temperature`` float32 [B], > 0 (not checked: that
    would need a device sync). ``workspace``: int64 zeros, 2 per row, left zero (default:
    ``sample_workspace``). ``sampled_host``: a pinned int64 [B] CPU tensor the kernel writes the
    ids into as well (readable once the stream has run it: no copy launch).
    """
    if workspace is None:
        workspace = sample_workspace(logits)
    torch.ops._C.gumbel_sample(sampled, logits, temperature, seeds, workspace, seed_offset, sampled_host)


def greedy_sample(sampled: torch.Tensor, logits: torch.Tensor,
                  workspace: torch.Tensor | None = None, sampled_host: torch.Tensor | None = None) -> None:
    """``sampled[i]`` <- argmax of ``logits[i]``: the lowest index among equal maxima, as
    ``torch.argmax``, but NaN never wins. CUDA only; the same one-pass, many-block kernel as
    ``gumbel_sample`` without the noise (ATen's argmax reduces a row in one block). ``workspace``
    and ``sampled_host`` as for ``gumbel_sample``."""
    if workspace is None:
        workspace = sample_workspace(logits)
    torch.ops._C.greedy_sample(sampled, logits, workspace, sampled_host)


def stage_decode_inputs(token_table: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                        src_token_table: torch.Tensor, src_seq_lens: torch.Tensor,
                        src_block_table: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
    """A decode step's B rows into a CUDA graph's static buffers, in one launch. CUDA only.

    ``token_table[:, :B]`` (int64 [3, N]: input ids, positions, slot mapping) <- ``src_token_table``
    [3, B]; ``seq_lens[:B]`` (int32 [N]) <- ``src_seq_lens``; ``block_table[:B, :W]`` (int32
    [N, M]) <- ``src_block_table`` [B, W]; ``input_ids`` (int64 [B], optional) replaces the copied
    input ids. Rows may be strided; the last dimension must be contiguous.
    """
    torch.ops._C.stage_decode_inputs(token_table, seq_lens, block_table, src_token_table, src_seq_lens,
                                     src_block_table, input_ids)


def gemv(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         rows_per_block: int = 0, norm_weight: torch.Tensor | None = None, epsilon: float = 0.0) -> None:
    """``out`` [M, N] <- ``input`` [M, K] @ ``weight`` [N, K]^T (+ ``bias``). CUDA, float16 only.

    The decode-step matrix-vector product for 1 <= M <= 4 tokens: one pass over the weight
    with 16-byte loads, FP32 accumulation. K must be a multiple of 8; input/out rows may be
    strided (row stride a multiple of 8 elements); ``rows_per_block`` (0 = automatic, 2, 4, 8)
    is the launch's weight rows per block. With ``norm_weight`` [K] the input is RMS-normalized
    first (a decoder layer's pre-norm, ``rms_norm(input, norm_weight, epsilon)``), in FP32 inside
    the same pass: the normalized rows are not rounded to float16 as rms_norm's output is.
    """
    torch.ops._C.gemv(out, input, weight, bias, rows_per_block, norm_weight, epsilon)


def gemv_silu_and_mul(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None, rows_per_block: int = 0,
                      norm_weight: torch.Tensor | None = None, epsilon: float = 0.0) -> None:
    """``out`` [M, N] <- silu(gate) * up with [gate | up] = ``input`` @ ``weight`` [2N, K]^T (+ ``bias``).

    gemv for an MLP's merged gate_up projection, with silu_and_mul done by the same blocks
    (gate and up rounded to the input dtype first, as the two ops in a row would): no [M, 2N]
    intermediate and no activation kernel. Same contract as ``gemv`` otherwise (``norm_weight``
    included).
    """
    torch.ops._C.gemv_silu_and_mul(out, input, weight, bias, rows_per_block, norm_weight, epsilon)


def gemv_add(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             rows_per_block: int = 0) -> None:
    """``out`` [M, N] += ``input`` [M, K] @ ``weight`` [N, K]^T (+ ``bias``), the product rounded to
    the dtype first: a projection added into the residual stream in the same kernel (what gemv
    and then fused_add_rms_norm's add compute). ``out`` must not overlap ``input``. Same
    contract as ``gemv`` otherwise.
    """
    torch.ops._C.gemv_add(out, input, weight, bias, rows_per_block)


def gemv_rope_cache(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    cos_sin_cache: torch.Tensor, is_neox: bool, norm_weight: torch.Tensor | None = None,
                    epsilon: float = 0.0) -> None:
    """An attention layer's decode qkv projection in one kernel: ``out`` [M, q | k | v] <- ``gemv``
    (``norm_weight``: with the norm prologue), then ``rotary_embedding_and_cache`` on it: RoPE
    on the query and key heads (full rotation: ``cos_sin_cache`` [max_position, head_size],
    float32 or float16) and the key/value rows written to ``kv_cache`` [2, blocks, block_size,
    kv_heads, head_size] at ``slot_mapping`` (int64 [M]; slots < 0 are skipped). The same
    roundings as the two ops in a row. ``positions`` int64 [M]. CUDA, float16 only.
    """
    torch.ops._C.gemv_rope_cache(out, input, weight, bias, positions, kv_cache, slot_mapping, cos_sin_cache,
                                 is_neox, norm_weight, epsilon)


def awq_dequantize(out: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> None:
    """out [K, N] float16 <- the AWQ weight of qweight int32 [K, N/8], qzeros int32 [K/g, N/8],
    scales float16 [K/g, N] (layers/quantization/awq.py). CUDA only."""
    torch.ops._C.awq_dequantize(out, qweight, qzeros, scales)


def awq_gemv(out: torch.Tensor, input: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor,
             scales: torch.Tensor) -> None:
    """out [M, N] float16 <- input [M, K] @ the AWQ weight, for 1 <= M <= 4 rows (decode). CUDA only."""
    torch.ops._C.awq_gemv(out, input, qweight, qzeros, scales)


def w4_dequantize(out: torch.Tensor, qweight: torch.Tensor, sz: torch.Tensor) -> None:
    """out [N, K] float16 <- W^T of the K-major 4-bit weight qweight int32 [N, K/8], sz float16
    [N, G, 2] (layers/quantization/w4_layout.py). CUDA only."""
    torch.ops._C.w4_dequantize(out, qweight, sz)


def w4_gemv(out: torch.Tensor, input: torch.Tensor, qweight: torch.Tensor, sz: torch.Tensor,
            rows_per_warp: int = 1) -> None:
    """out [M, N] float16 <- input [M, K] @ the K-major 4-bit weight, 1 <= M <= 8 (decode); each
    warp computes ``rows_per_warp`` (1, 2 or 4; 1 or 2 above 4 rows) outputs. CUDA only."""
    torch.ops._C.w4_gemv(out, input, qweight, sz, rows_per_warp)


def w4_gemm(out: torch.Tensor, input: torch.Tensor, qweight: torch.Tensor, sz: torch.Tensor,
            block_m: int = 16, block_n: int = 64, splits: int = 1) -> None:
    """out [M, N] float16 <- input [M, K] @ the K-major 4-bit weight on tensor cores (WMMA, FP32
    accumulation), tiles of block_m (16, 32, 64) x block_n (32, 64, 128; not 16 x 32) outputs, K
    split ``splits`` ways (FP32 partials summed by a second kernel). CUDA only."""
    torch.ops._C.w4_gemm(out, input, qweight, sz, block_m, block_n, splits)


def fp8_gemv(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, group_k: int,
             bias: torch.Tensor | None = None, rows_per_block: int = 0) -> None:
    """out [M, N] <- input [M, K] @ W^T (+ bias) for 1 <= M <= 8 rows (decode), float16 (bfloat16 on
    SM80+), W = weight float8_e4m3fn [N, K] times scales float32 [N, ceil(K / group_k)] (or [N, 1]),
    converted in registers (layers/quantization/fp8.py); ``rows_per_block`` weight rows a block (0:
    automatic, 2, 4, or 8 for up to 2 input rows). CUDA only."""
    torch.ops._C.fp8_gemv(out, input, weight, scales, group_k, bias, rows_per_block)


def fp8_dequantize(out: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, group_k: int) -> None:
    """out [N, K] (float16 / bfloat16) <- W = weight float8_e4m3fn [N, K] times its scales (as fp8_gemv).
    CUDA only."""
    torch.ops._C.fp8_dequantize(out, weight, scales, group_k)


def fp8_gemm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, group_k: int,
             bias: torch.Tensor | None = None, split_k: int = 0) -> None:
    """fp8_gemv's product for any number of rows M, on tensor cores (16-bit MMAs of the weight tiles
    converted and scaled in shared memory, FP32 accumulation); ``split_k`` K splits (0: automatic).
    CUDA only."""
    torch.ops._C.fp8_gemm(out, input, weight, scales, group_k, bias, split_k)


def gguf_gemv(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, qtype: int,
              bias: torch.Tensor | None = None) -> None:
    """out [M, N] float16 <- input [M, K] @ W^T (+ bias) for 1 <= M <= 8 rows (decode), W = the GGUF
    blocks uint8 [N, row_bytes] of GGML type ``qtype`` (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) decoded in
    registers (layers/quantization/gguf.py). CUDA only."""
    torch.ops._C.gguf_gemv(out, input, weight, qtype, bias)


def gguf_dequantize(out: torch.Tensor, weight: torch.Tensor, qtype: int) -> None:
    """out [N, K] float16 <- W = the GGUF blocks uint8 [N, row_bytes] of GGML type ``qtype``. CUDA only."""
    torch.ops._C.gguf_dequantize(out, weight, qtype)


def gated_delta_rule_decode(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            a: torch.Tensor, b: torch.Tensor, state: torch.Tensor, state_slots: torch.Tensor,
                            scale: float, qk_l2norm: bool, A_log: torch.Tensor | None = None,
                            dt_bias: torch.Tensor | None = None, col_threads: int = 0) -> None:
    """One Gated DeltaNet step per sequence (Qwen3.5 / Qwen3-Next linear attention). CUDA only.

    ``q``, ``k`` [B, Hk, Dk], ``v`` [B, Hv, Dv] (token rows may be strided), ``out`` [B, Hv, Dv];
    ``a``, ``b`` [B, Hv]: g (log decay) and beta, or with ``A_log`` / ``dt_bias`` [Hv] the raw
    projections (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)); ``state``
    [num_slots, Hv, Dk, Dv] (float32 or q's dtype) at ``state_slots`` [B] int32, read and written
    once (negative slot: skipped, zeros out). ``col_threads`` (0 = automatic, 2, 4, 8) sets the
    state columns per block (4 per thread). See layers/gdn_ops.py for the full contract.
    """
    torch.ops._C.gated_delta_rule_decode(out, q, k, v, a, b, state, state_slots, scale, qk_l2norm, A_log, dt_bias,
                                         col_threads)


def gated_delta_rule_prefill(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             a: torch.Tensor, b: torch.Tensor, state: torch.Tensor, state_slots: torch.Tensor,
                             query_start_loc: torch.Tensor, has_initial_state: torch.Tensor | None, scale: float,
                             qk_l2norm: bool, A_log: torch.Tensor | None = None,
                             dt_bias: torch.Tensor | None = None, col_threads: int = 0) -> None:
    """``gated_delta_rule_decode`` over varlen sequences (tokens ``query_start_loc[i]`` to
    ``query_start_loc[i + 1]`` of the [N, ...] inputs), each from its slot's state (or zeros where
    ``has_initial_state[i]`` is False), the final state written back to the slot. CUDA only."""
    torch.ops._C.gated_delta_rule_prefill(out, q, k, v, a, b, state, state_slots, query_start_loc,
                                          has_initial_state, scale, qk_l2norm, A_log, dt_bias, col_threads)


def causal_conv1d_update(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         conv_state: torch.Tensor, state_slots: torch.Tensor, silu: bool) -> None:
    """Decode step of a causal depthwise conv1d: ``out`` [B, C] <- conv of each channel's
    ``conv_state`` [num_slots, C, W - 1] entries at ``state_slots`` [B] then ``x`` [B, C] with
    ``weight`` [C, W] (+ ``bias``), SiLU if ``silu``; the state shifts by one. CUDA only."""
    torch.ops._C.causal_conv1d_update(out, x, weight, bias, conv_state, state_slots, silu)


def causal_conv1d_fn(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     conv_state: torch.Tensor, query_start_loc: torch.Tensor, state_slots: torch.Tensor,
                     has_initial_state: torch.Tensor | None, silu: bool) -> None:
    """Varlen prefill of the causal depthwise conv1d: each sequence of ``x`` [N, C] continues
    from its slot's conv state (zeros where ``has_initial_state`` is False), whose last W - 1
    inputs are written back to the slot. CUDA only."""
    torch.ops._C.causal_conv1d_fn(out, x, weight, bias, conv_state, query_start_loc, state_slots,
                                  has_initial_state, silu)


def gated_rms_norm(out: torch.Tensor, x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   epsilon: float) -> None:
    """Gated DeltaNet's norm before out_proj: each head's ``weight.numel()`` entries of ``x``
    [N, heads * dim] RMS-normalized, times ``weight``, times silu(``gate``) (FP32 math, rounded
    as transformers' RMSNormGated); rows of x / gate / out may be strided. CUDA only."""
    torch.ops._C.gated_rms_norm(out, x, gate, weight, epsilon)


def topk_softmax(topk_weights: torch.Tensor, topk_ids: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor) -> None:
    """Each token's top-k experts by softmax of ``gating_output`` [T, E] (FP32 math): ``topk_weights``
    float32 [T, k] (largest first, not renormalized), ``topk_ids`` int32, ``token_expert_indices``
    int32 (j * T + t, vLLM's). Every id is in [0, E), NaN logits included. CUDA only."""
    torch.ops._C.topk_softmax(topk_weights, topk_ids, token_expert_indices, gating_output)


def topk_sigmoid(topk_weights: torch.Tensor, topk_ids: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor) -> None:
    """``topk_softmax`` with a per-expert sigmoid score instead of the softmax. CUDA only."""
    torch.ops._C.topk_sigmoid(topk_weights, topk_ids, token_expert_indices, gating_output)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                         sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                         num_tokens_post_pad: torch.Tensor) -> None:
    """The (token, expert) pairs of ``topk_ids`` (int32 [T, k]) sorted by expert, each expert padded
    to a multiple of ``block_size`` with the id T k; ``experts_ids`` one expert per block (-1 past
    the end); ``num_tokens_post_pad`` [1] the padded length (layers/moe_routing.py). CUDA only."""
    torch.ops._C.moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                                      num_tokens_post_pad)


def moe_sum(input: torch.Tensor, output: torch.Tensor) -> None:
    """``output`` [T, H] <- ``input`` [T, k, H] summed over k in FP32. CUDA only."""
    torch.ops._C.moe_sum(input, output)


def moe_gemv_silu_and_mul(out: torch.Tensor, input: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor,
                          rows_per_block: int = 0) -> None:
    """Decode gate_up of each token's chosen experts: ``out`` [T, k, I] <- silu(gate) * up with
    [gate | up] = ``input`` [T, H] @ ``w13``[e] [2I, H]^T, e = ``topk_ids`` [t, j] (int32). Only the
    chosen experts' rows are read (16-byte loads, FP32 accumulation). CUDA; float16 / float32
    (bfloat16 on SM80+)."""
    torch.ops._C.moe_gemv_silu_and_mul(out, input, w13, topk_ids, rows_per_block)


def moe_gemv_gelu_tanh_and_mul(out: torch.Tensor, input: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor,
                               rows_per_block: int = 0) -> None:
    """``moe_gemv_silu_and_mul`` with the tanh-approximated GELU (``gelu_tanh_and_mul``'s) for SiLU."""
    torch.ops._C.moe_gemv_gelu_tanh_and_mul(out, input, w13, topk_ids, rows_per_block)


def moe_gemv_down_sum(out: torch.Tensor, input: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                      topk_weights: torch.Tensor, rows_per_block: int = 0) -> None:
    """Decode down projection and top-k sum: ``out`` [T, H] <- sum_j ``topk_weights``[t, j] *
    ``input``[t, j] @ ``w2``[e] [H, I]^T in FP32, rounded once. CUDA; dtypes as above."""
    torch.ops._C.moe_gemv_down_sum(out, input, w2, topk_ids, topk_weights, rows_per_block)


def moe_grouped_gemm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                     sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                     num_tokens_post_pad: torch.Tensor, topk_weights: torch.Tensor | None, top_k: int,
                     block_size: int) -> None:
    """Tensor-core grouped GEMM over expert-sorted pairs (``moe_align_block_size`` output for this
    ``block_size``: 16, 32 or 64): ``out``[p] [N] <- ``input``[p // top_k] @ ``weight``[e] [N, K]^T
    (times ``topk_weights``.flatten()[p]) for every pair p of a block of expert e. CUDA; float16
    (bfloat16 on SM80+)."""
    torch.ops._C.moe_grouped_gemm(out, input, weight, sorted_token_ids, experts_ids, num_tokens_post_pad,
                                  topk_weights, top_k, block_size)


def moe_w4_gemv_act_and_mul(out: torch.Tensor, input: torch.Tensor, qweight: torch.Tensor, sz: torch.Tensor,
                            topk_ids: torch.Tensor, activation: int = 0) -> None:
    """4-bit decode gate/up: ``out`` [T, k, I] <- act(x W_e[:I]^T) * (x W_e[I:]^T) for each token's
    chosen experts, ``qweight`` int32 [E, 2I, H/8] K-major and ``sz`` float16 [E, 2I, G, 2]
    (moe_w4_layout.py); ``activation`` 0 SiLU, 1 GELU-tanh. CUDA; float16."""
    torch.ops._C.moe_w4_gemv_act_and_mul(out, input, qweight, sz, topk_ids, activation)


def moe_w4_gemv_down_sum(out: torch.Tensor, input: torch.Tensor, qweight: torch.Tensor, sz: torch.Tensor,
                         topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
    """4-bit decode down projection and top-k sum: ``out`` [T, H] <- sum_j ``topk_weights``[t, j] *
    ``input``[t, j] @ W_e^T in FP32, rounded once. CUDA; float16."""
    torch.ops._C.moe_w4_gemv_down_sum(out, input, qweight, sz, topk_ids, topk_weights)


def moe_w4_dequantize(out: torch.Tensor, qweight: torch.Tensor, sz: torch.Tensor, experts: torch.Tensor) -> None:
    """``out`` float16 [n, N, K] <- the 4-bit weights of ``experts`` (int32 [n]). CUDA."""
    torch.ops._C.moe_w4_dequantize(out, qweight, sz, experts)
