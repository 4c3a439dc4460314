"""paged_attention_decode at long contexts (16k-128k tokens) against a float64 reference on the
GPU: the default and tuned-style launches, partitions that straddle cache blocks, sliding windows,
short sequences in a grid sized for a long one (as a CUDA graph replays). GPU only; in both
modes (native, and VLLM_VOLTA_DEVICE_CAPABILITY=7.0 with a 7.5+PTX build)."""
from __future__ import annotations

import math

import pytest
import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.attention.backends.paged_decode_launch import default_launch_config

from .op_cases import TOLERANCES, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

CASES = [
    # (dtype, head_size, num_heads, kv_heads, seq_lens, block_size, launch, window)
    # launch: (partition_size, num_threads), or None for default_launch_config on this GPU
    (torch.float16, 128, 28, 4, [32768], 16, None, None),  # Qwen2.5-7B at 32k, the default launch
    (torch.float16, 128, 28, 4, [32768], 16, (1024, 192), None),
    (torch.float16, 128, 32, 8, [131072], 16, None, None),  # Llama-3.1-8B at 128k
    (torch.float16, 128, 32, 8, [131072 - 4093, 70, 1], 16, (512, 128), None),  # short ones in a long grid
    (torch.float16, 128, 32, 8, [20000] * 8, 16, None, None),  # batch 8
    (torch.float16, 64, 9, 3, [65536 + 7], 16, None, None),  # SmolLM2
    (torch.float16, 128, 12, 2, [40000], 48, (256, 128), None),  # 256-token partitions over 48-token blocks
    (torch.float16, 128, 12, 2, [20011], 32, (48, 128), None),  # half tiles: the CUDA-core kernel
    (torch.float16, 256, 16, 8, [65536], 16, (256, 128), 4096),  # Gemma sliding layer, window 4096
    (torch.float16, 256, 16, 8, [50001], 16, None, 1000),  # a window not a multiple of the block
    (torch.float16, 512, 16, 2, [32768], 16, None, None),  # Gemma 4 full layer
    (torch.float32, 128, 8, 2, [40000], 16, (512, 128), None),
    (torch.bfloat16, 128, 32, 8, [100000], 16, None, None),
]


def _needle_cache(seq_lens, block_size, kv_heads, head_size, dtype, q, gen):
    """A random cache, block table and the needles: per sequence a few keys that match the
    query heads of their KV head (early, middle, last token), so the output is dominated by a few
    partitions' values and a dropped or misweighted partition shows."""
    device = q.device
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 1
    width = max(blocks_per_seq)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen, device=device).to(dtype)
    perm = (torch.randperm(num_blocks - 1, generator=gen, device=device) + 1).to(torch.int32)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=device)
    used = 0
    group = q.shape[1] // kv_heads
    for i, n in enumerate(seq_lens):
        table[i, :blocks_per_seq[i]] = perm[used:used + blocks_per_seq[i]]
        used += blocks_per_seq[i]
        direction = q[i].float().view(kv_heads, group, head_size).mean(1)
        direction = direction / direction.norm(dim=-1, keepdim=True) * math.sqrt(head_size) * 3
        for pos in {n // 7, n // 2, n - 1}:
            blk, off = table[i, pos // block_size].long(), pos % block_size
            cache[0, blk, off] = direction.to(dtype)
    return cache, table


def _reference(q, cache, table, seq_lens, scale, window):
    """float64 on the GPU, per sequence, grouped query heads against their KV head (no repeat)."""
    num_seqs, heads, d = q.shape
    block_size, kv_heads = cache.shape[2], cache.shape[3]
    group = heads // kv_heads
    out = torch.empty(num_seqs, heads, d, dtype=torch.float64, device=q.device)
    for i, n in enumerate(seq_lens):
        pos = torch.arange(0 if window is None else max(0, n - window), n, device=q.device)
        blocks = table[i].long()[pos // block_size]
        k = cache[0][blocks, pos % block_size].double()  # [n, KH, D]
        v = cache[1][blocks, pos % block_size].double()
        qi = q[i].double().view(kv_heads, group, d)
        probs = (torch.einsum("kgd,nkd->kgn", qi, k) * scale).softmax(-1)
        out[i] = torch.einsum("kgn,nkd->kgd", probs, v).reshape(heads, d)
    return out


@pytest.mark.parametrize("dtype,head_size,num_heads,kv_heads,seq_lens,block_size,launch,window", CASES)
def test_long_context_decode_matches_float64(dtype, head_size, num_heads, kv_heads, seq_lens, block_size,
                                             launch, window):
    if dtype == torch.bfloat16 and not ops.cuda_bf16_kernels_built():
        pytest.skip("bfloat16 kernels are not built")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(sum(seq_lens) + head_size)
    q = torch.randn(len(seq_lens), num_heads, head_size, generator=gen, device=device).to(dtype)
    cache, table = _needle_cache(seq_lens, block_size, kv_heads, head_size, dtype, q, gen)
    max_len = max(seq_lens)
    if launch is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        span = max_len if window is None else min(max_len, window)
        cfg = default_launch_config(len(seq_lens), num_heads, kv_heads, sms, span)
        launch = (cfg["partition_size"], cfg["num_threads"])
    scale = 1 / math.sqrt(head_size)
    out = torch.empty_like(q)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    ops.paged_attention_decode(out, q, cache, table, lens, scale, max_len, launch[0], launch[1],
                               sliding_window=window)
    ref = _reference(q, cache, table, seq_lens, scale, window)
    assert ref.abs().max() > 0.3  # the needles carry weight: the comparison is not of near-zero means
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[dtype])
