"""reshape_and_cache / paged_attention_decode (CUDA kernels) vs plain-PyTorch references, and
their argument checks (Meta kernels: run on CPU too)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from vllm_volta import _custom_ops as ops

from .op_cases import TOLERANCES, requires_gpu


def random_cache(num_blocks: int, block_size: int, kv_heads: int, head_size: int, dtype, device,
                 seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen).to(dtype).to(device)


def random_block_table(seq_lens: list[int], block_size: int, num_blocks: int, width: int, seed: int = 0) -> torch.Tensor:
    """Distinct random physical blocks per sequence (block 0 reserved), padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(seq_lens):
        nb = -(-n // block_size)
        table[i, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    return table


def decode_reference(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: list[int],
                     scale: float, window: int | None = None, soft_cap: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v per sequence in float64, K/V gathered through the block table;
    with a window only the last `window` tokens, with a soft cap the scores s -> cap * tanh(s / cap)."""
    num_seqs, num_heads, d = q.shape
    block_size, kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    out = torch.zeros(num_seqs, num_heads, d, dtype=torch.float64)
    kv_cache, block_table, q = kv_cache.cpu(), block_table.long().cpu(), q.cpu().double()
    for i, n in enumerate(seq_lens):
        pos = torch.arange(0 if window is None else max(0, n - window), n)
        blocks = block_table[i][pos // block_size]
        k = kv_cache[0][blocks, pos % block_size].double()  # [n, KH, D]
        v = kv_cache[1][blocks, pos % block_size].double()
        k = k.repeat_interleave(num_heads // kv_heads, dim=1)
        v = v.repeat_interleave(num_heads // kv_heads, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i], k) * scale
        if soft_cap is not None:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        out[i] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out


DECODE_CASES = [
    # (dtype, head_size, num_heads, kv_heads, seq_lens, partition_size, num_threads)
    (torch.float16, 128, 32, 8, [1, 17, 64, 600, 1333], 512, 128),  # Llama-3 GQA 4, split contexts
    (torch.float16, 128, 12, 2, [5, 300, 1024], 256, 256),  # Qwen2.5-1.5B: GQA 6 -> 6 heads/block (bound 8)
    (torch.float16, 128, 12, 2, [5, 300, 1024], 256, 96),  # 3 warps per block
    (torch.float16, 128, 28, 4, [77, 2049], 512, 64),  # Qwen2.5-7B: GQA 7 -> 7 heads/block (bound 8)
    (torch.float16, 64, 9, 3, [3, 40, 129], 32, 128),  # tiny partitions, many of them; GQA 3 (bound 4)
    (torch.float16, 96, 8, 8, [33, 95], 1024, 512),  # MHA, single partition
    (torch.float16, 128, 24, 2, [50, 700], 128, 256),  # GQA 12 -> 2 blocks of 6 heads per KV head
    (torch.float16, 128, 16, 1, [260], 64, 64),  # MQA 16 -> 2 blocks of 8 heads per KV head
    (torch.float16, 256, 16, 2, [200, 513], 128, 128),  # GQA 8 -> 8 heads/block
    # head size 512 (Gemma 4's full layers: 4 KV heads, GQA 8): tensor cores with fewer warps
    # where the tiles do not fit shared memory, CUDA cores for a half-tile partition and FP32
    (torch.float16, 512, 32, 4, [1, 100, 1500], 256, 128),
    (torch.float16, 512, 8, 1, [3000], 1024, 256),
    (torch.float16, 512, 4, 2, [70, 400], 48, 128),
    (torch.float32, 512, 4, 2, [33, 600], 512, 128),
    (torch.bfloat16, 512, 16, 2, [90, 1100], 512, 128),
    # grids of several waves of resident blocks; at the longest tuned partition the launcher may
    # split the context into fewer, longer partitions (2 of 1504 tokens here)
    (torch.float16, 128, 32, 8, [1100] * 40 + [5, 700], 256, 128),
    (torch.float16, 128, 32, 8, [3000] * 40 + [5, 2500], 1024, 192),
    (torch.float16, 128, 12, 2, [40] * 999 + [700], 1024, 128),
    # FP16 on CUDA cores: a partition of half tiles; a tensor-core tile set past shared memory
    (torch.float16, 128, 32, 8, [70, 400], 48, 128),
    (torch.float16, 256, 8, 1, [1500], 1024, 512),
    (torch.float32, 128, 8, 2, [31, 700], 512, 128),
    (torch.float32, 256, 4, 4, [65], 64, 64),
    # BF16 on tensor cores (SM80+), then on CUDA cores (a partition of half tiles)
    (torch.bfloat16, 128, 32, 8, [100, 900], 512, 128),
    (torch.bfloat16, 128, 12, 2, [5, 300, 1024], 256, 96),
    (torch.bfloat16, 64, 9, 3, [3, 40, 129], 32, 128),
    # (512 threads asked: more than the bf16 kernel's registers allow; the launcher fits them)
    (torch.bfloat16, 128, 12, 2, [70, 400], 48, 512),
]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype,head_size,num_heads,kv_heads,seq_lens,partition_size,num_threads", DECODE_CASES)
@pytest.mark.parametrize("max_len_slack", [0, 700], ids=["exact-max", "graph-max"])
@pytest.mark.parametrize("block_size", [16, 24, 48],
                         ids=["block16", "block24-straddles-partitions", "block48-runs-of-16"])
def test_paged_attention_decode_matches_reference(dtype, head_size, num_heads, kv_heads, seq_lens,
                                                  partition_size, num_threads, max_len_slack, block_size):
    if dtype == torch.bfloat16 and not (torch.cuda.get_device_capability() >= (8, 0) and ops.cuda_bf16_kernels_built()):
        pytest.skip("bfloat16 needs a GPU of compute capability >= 8.0 and a build targeting it")
    device = "cuda"
    width = -(-(max(seq_lens) + max_len_slack) // block_size)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    kv_cache = random_cache(num_blocks, block_size, kv_heads, head_size, dtype, device)
    table = random_block_table(seq_lens, block_size, num_blocks, width).to(device)
    # Query rows strided as in a fused qkv projection output.
    qkv = torch.randn(len(seq_lens), (num_heads + 2 * kv_heads) * head_size, dtype=dtype, device=device)
    q = qkv[:, : num_heads * head_size].view(len(seq_lens), num_heads, head_size)
    scale = 1.0 / math.sqrt(head_size)
    out = torch.full_like(q, float("nan")).contiguous()
    ops.paged_attention_decode(out, q, kv_cache, table, torch.tensor(seq_lens, dtype=torch.int32, device=device),
                               scale, max(seq_lens) + max_len_slack, partition_size, num_threads)
    ref = decode_reference(q, kv_cache, table, seq_lens, scale)
    tol = TOLERANCES[dtype] if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.cpu().double(), ref, **{k: v * 2 for k, v in tol.items()})


WINDOW_CASES = [
    # (dtype, head_size, num_heads, kv_heads, seq_lens, partition_size, num_threads, window, soft_cap)
    (torch.float16, 128, 12, 2, [1, 5, 40, 300, 1024, 2100], 256, 128, 100, None),  # window mid-tile
    (torch.float16, 128, 12, 2, [1, 5, 40, 300, 1024, 2100], 256, 128, 96, None),  # window of whole tiles
    (torch.float16, 256, 8, 4, [3, 600, 1500, 5000], 1024, 192, 4096, 50.0),  # Gemma 2: window and cap
    (torch.float16, 256, 4, 1, [2, 511, 512, 513, 1300], 64, 128, 512, None),  # Gemma 3 1B: 4 heads, MQA
    (torch.float16, 128, 32, 8, [1, 33, 700], 512, 128, 1, None),  # a window of one token
    (torch.float16, 128, 32, 8, [30, 700, 1333], 512, 128, None, 1.5),  # a cap that changes the softmax
    (torch.float16, 128, 32, 8, [70, 400, 1000], 48, 128, 90, 2.0),  # CUDA cores (half tiles)
    (torch.float32, 128, 8, 2, [31, 700], 64, 128, 45, 1.0),  # CUDA cores, fp32
    (torch.bfloat16, 128, 12, 2, [5, 300, 1024], 256, 96, 130, 2.0),
]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype,head_size,num_heads,kv_heads,seq_lens,partition_size,num_threads,window,soft_cap",
                         WINDOW_CASES)
@pytest.mark.parametrize("max_len_slack", [0, 700], ids=["exact-max", "graph-max"])
@pytest.mark.parametrize("block_size", [16, 24])
def test_sliding_window_and_soft_cap_match_reference(dtype, head_size, num_heads, kv_heads, seq_lens, partition_size,
                                                     num_threads, window, soft_cap, max_len_slack, block_size):
    if dtype == torch.bfloat16 and not (torch.cuda.get_device_capability() >= (8, 0) and ops.cuda_bf16_kernels_built()):
        pytest.skip("bfloat16 needs a GPU of compute capability >= 8.0 and a build targeting it")
    device = "cuda"
    width = -(-(max(seq_lens) + max_len_slack) // block_size)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    kv_cache = random_cache(num_blocks, block_size, kv_heads, head_size, dtype, device, seed=3)
    table = random_block_table(seq_lens, block_size, num_blocks, width, seed=3).to(device)
    gen = torch.Generator().manual_seed(4)
    # Large queries, so that the scores are large enough for a cap to matter.
    q = (3 * torch.randn(len(seq_lens), num_heads, head_size, generator=gen)).to(dtype).to(device)
    scale = 1.0 / math.sqrt(head_size)
    out = torch.full_like(q, float("nan"))
    ops.paged_attention_decode(out, q, kv_cache, table, torch.tensor(seq_lens, dtype=torch.int32, device=device),
                               scale, max(seq_lens) + max_len_slack, partition_size, num_threads,
                               sliding_window=window, logits_soft_cap=soft_cap)
    ref = decode_reference(q, kv_cache, table, seq_lens, scale, window, soft_cap)
    tol = TOLERANCES[dtype] if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.cpu().double(), ref, **{k: v * 2 for k, v in tol.items()})
    plain = decode_reference(q, kv_cache, table, seq_lens, scale)
    assert (plain - ref).abs().max() > 0.05  # the window / cap mattered


@pytest.mark.gpu
@requires_gpu
def test_split_contexts_repeat_and_replay_in_a_graph():
    # Split contexts (partition scratch + combine): eager launches of other lengths on the same
    # buffers (an empty context among them: zeros), then a captured launch replayed with new
    # lengths.
    device, d, heads, kv_heads, block_size, max_len = "cuda", 128, 32, 8, 16, 2048
    kv_cache = random_cache(140, block_size, kv_heads, d, torch.float16, device, seed=3)
    table = random_block_table([max_len], block_size, 140, max_len // block_size, seed=3).to(device).repeat(3, 1)
    q = torch.randn(3, heads, d, dtype=torch.float16, device=device)
    seq_lens = torch.zeros(3, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    scale = d ** -0.5

    def launch():
        ops.paged_attention_decode(out, q, kv_cache, table, seq_lens, scale, max_len, 128, 256)

    def check(lens):
        ref = decode_reference(q, kv_cache, table, lens, scale)
        torch.testing.assert_close(out.cpu().double(), ref, atol=2e-3, rtol=2e-3)

    for lens in ([600, 1333, 0], [1, 2048, 129], [600, 1333, 0]):
        seq_lens.copy_(torch.tensor(lens))
        out.fill_(float("nan"))
        launch()
        check(lens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for lens in ([700, 5, 1999], [129, 128, 2000]):
        seq_lens.copy_(torch.tensor(lens))
        graph.replay()
        check(lens)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["tensor-core", "cuda-core"])
def test_partitions_past_a_short_context_never_reach_the_output(dtype):
    # A grid sized for 4096 tokens (64 partitions of 64) over contexts of 1-200 tokens: most
    # partitions of every sequence are not written by this launch, and their rows of the fp32
    # scratch keep whatever the allocator's block held. The combine step must not read them as
    # numbers; here that block is a freed tensor of the same size, full of NaN.
    device, d, heads, kv_heads, block_size, max_len = "cuda", 128, 32, 8, 16, 4096
    seq_lens = [1, 64, 65, 200]
    kv_cache = random_cache(60, block_size, kv_heads, d, dtype, device, seed=5)
    table = random_block_table(seq_lens, block_size, 60, max_len // block_size, seed=5).to(device)
    q = torch.randn(len(seq_lens), heads, d, dtype=dtype, device=device)
    out = torch.empty_like(q)
    scratch_floats = len(seq_lens) * heads * (max_len // 64) * (d + 2)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    torch.full((scratch_floats,), float("nan"), dtype=torch.float32, device=device)  # freed at once
    ops.paged_attention_decode(out, q, kv_cache, table, lens, d ** -0.5, max_len, 64, 128)
    ref = decode_reference(q, kv_cache, table, seq_lens, d ** -0.5)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-3, rtol=2e-3)


_DECODE_LAUNCH_SCRIPT = """
import json, math, sys, torch
from torch.profiler import ProfilerActivity, profile
from vllm_volta import _custom_ops as ops
d, heads, kv_heads, block_size, n = 256, 16, 2, 16, 1000
cache = torch.randn(2, n // block_size + 1, block_size, kv_heads, d, dtype=torch.half, device="cuda")
table = torch.arange(n // block_size + 1, dtype=torch.int32, device="cuda")[None]
q = torch.randn(1, heads, d, dtype=torch.half, device="cuda")
out = torch.empty_like(q)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    ops.paged_attention_decode(out, q, cache, table, torch.tensor([n], dtype=torch.int32, device="cuda"),
                               1 / math.sqrt(d), n, 1024, 128)
    torch.cuda.synchronize()
prof.export_chrome_trace(sys.argv[1])
events = json.load(open(sys.argv[1]))["traceEvents"]
print(json.dumps([[e["name"], e["args"]["block"][0]] for e in events
                  if e.get("cat") == "kernel" and "paged_attention" in e["name"]]))
"""


@pytest.mark.gpu
@requires_gpu
def test_tensor_core_blocks_fit_the_emulated_sm(tmp_path):
    # Head size 256, 8 heads per block, one 1024-token partition, 4 warps: 107,328 bytes of
    # shared memory (tc_smem_bytes), more than an SM70 SM has (96 KiB). With
    # VLLM_VOLTA_DEVICE_CAPABILITY=7.0 the launcher must give the block 3 warps (89,792 bytes),
    # as on a V100; with 7.5 (64 KiB) not even 2 warps fit (72,256 bytes) and the CUDA-core
    # kernel runs. With the device's own capability: 4 warps where a block may have 107,328
    # bytes (H100/H200, A100).
    fits_natively = torch.cuda.get_device_properties(0).shared_memory_per_block_optin >= 107_328
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def launches(capability):
        env = {k: v for k, v in os.environ.items() if k != "VLLM_VOLTA_DEVICE_CAPABILITY"}
        env.update({"VLLM_VOLTA_DEVICE_CAPABILITY": capability} if capability else {})
        res = subprocess.run([sys.executable, "-c", _DECODE_LAUNCH_SCRIPT, str(tmp_path / "trace.json")],
                             env=env, capture_output=True, text=True, cwd=root)
        assert res.returncode == 0, res.stderr
        return [("tc" if "_tc_kernel" in name else "cuda_core", threads)
                for name, threads in json.loads(res.stdout.splitlines()[-1])]

    assert launches(None) == ([("tc", 128)] if fits_natively else [("cuda_core", 128)])
    assert launches("7.0") == [("tc", 96)]
    assert launches("7.5") == [("cuda_core", 128)]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["2d-strided", "3d"])
def test_reshape_and_cache_matches_index_write(dtype, layout):
    from vllm_volta.attention.layer import write_to_kv_cache

    device, kv_heads, d = "cuda", 4, 96
    kv_cache = random_cache(6, 16, kv_heads, d, dtype, device)
    expected = kv_cache.clone()
    fused = torch.randn(10, 3 * kv_heads * d, dtype=dtype, device=device)  # [q | k | v]-like rows
    key, value = fused[:, kv_heads * d: 2 * kv_heads * d], fused[:, 2 * kv_heads * d:]
    if layout == "3d":
        key, value = key.reshape(10, kv_heads, d), value.reshape(10, kv_heads, d)
    slots = torch.tensor([5, -1, 17, 95, 0, 40, -1, 33, 64, 2], dtype=torch.int64, device=device)
    ops.reshape_and_cache(key, value, kv_cache, slots[:9])  # a padded 10th token is not written
    write_to_kv_cache(key, value, expected, slots[:9])
    assert torch.equal(kv_cache, expected)


@pytest.mark.gpu
@requires_gpu
def test_attention_ops_opcheck():
    device, dtype = "cuda", torch.float16
    kv_cache = random_cache(8, 16, 2, 64, dtype, device)
    key = torch.randn(3, 2, 64, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops._C.reshape_and_cache.default,
                          (key, key.clone(), kv_cache, torch.tensor([1, 7, 20], device=device)))
    q = torch.randn(2, 4, 64, dtype=dtype, device=device)
    table = random_block_table([20, 40], 16, 8, 4).to(device)
    seq_lens = torch.tensor([20, 40], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops._C.paged_attention_decode.default,
                          (torch.empty_like(q), q, kv_cache, table, seq_lens, 0.125, 64, 32, 128))


def _meta_decode_args(**overrides):
    meta = dict(device="meta")
    args = dict(out=torch.empty(2, 8, 128, dtype=torch.float16, **meta),
                query=torch.empty(2, 8, 128, dtype=torch.float16, **meta),
                kv_cache=torch.empty(2, 10, 16, 2, 128, dtype=torch.float16, **meta),
                block_table=torch.empty(2, 4, dtype=torch.int32, **meta),
                seq_lens=torch.empty(2, dtype=torch.int32, **meta),
                scale=0.1, max_seq_len=64, partition_size=512, num_threads=128)
    args.update(overrides)
    return args


BAD_DECODE = [
    (dict(query=torch.empty(2, 8, 128, dtype=torch.float32, device="meta")), "'query' has dtype float32"),
    (dict(kv_cache=torch.empty(10, 16, 2, 128, dtype=torch.float16, device="meta")), "'kv_cache' must be [2, num_blocks"),
    (dict(query=torch.empty(2, 7, 128, dtype=torch.float16, device="meta"),
          out=torch.empty(2, 7, 128, dtype=torch.float16, device="meta")), "num_heads (7) must be a positive multiple"),
    (dict(query=torch.empty(2, 8, 80, dtype=torch.float16, device="meta"),
          kv_cache=torch.empty(2, 10, 16, 2, 80, dtype=torch.float16, device="meta")), "head_size 80 is not supported"),
    (dict(block_table=torch.empty(2, 4, dtype=torch.int64, device="meta")), "'block_table' must be int32"),
    (dict(block_table=torch.empty(3, 4, dtype=torch.int32, device="meta")), "'block_table' must have one row per sequence"),
    (dict(seq_lens=torch.empty(3, dtype=torch.int32, device="meta")), "'seq_lens' must have 2 entries"),
    (dict(max_seq_len=65), "'max_seq_len' must be in [0, 64]"),
    (dict(partition_size=100), "'partition_size' must be a multiple of 16"),
    (dict(num_threads=80), "'num_threads' must be a multiple of 32 in [64, 512]"),
    (dict(scale=0.0), "'scale' must be > 0"),
    (dict(sliding_window=-1), "'sliding_window' must be >= 0 (0 = none)"),
    (dict(logits_soft_cap=-2.0), "'logits_soft_cap' must be >= 0 (0 = none)"),
    (dict(out=torch.empty(2, 8, 64, dtype=torch.float16, device="meta")), "'out' must have the same shape"),
]


@pytest.mark.parametrize("overrides,message", BAD_DECODE)
def test_paged_attention_decode_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"paged_attention_decode: {message}")):
        torch.ops._C.paged_attention_decode(**_meta_decode_args(**overrides))


def test_paged_attention_decode_accepts_valid_meta_args():
    torch.ops._C.paged_attention_decode(**_meta_decode_args())


@pytest.mark.gpu
@requires_gpu
def test_bf16_without_bf16_kernels_is_a_clear_error():
    if ops.cuda_bf16_kernels_built() and torch.cuda.get_device_capability() >= (8, 0):
        pytest.skip("this build and GPU have bf16 kernels")
    cache = random_cache(4, 16, 2, 64, torch.bfloat16, "cuda")
    key = torch.randn(2, 2, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="reshape_and_cache: bfloat16"):
        ops.reshape_and_cache(key, key, cache, torch.tensor([0, 1], device="cuda"))


@pytest.mark.parametrize("key_shape,slot_dtype,message", [
    ((3, 2, 64), torch.int32, "'slot_mapping' must be int64"),
    ((3, 3, 64), torch.int64, "'key' must be [num_tokens, 2, 64] or [num_tokens, 128]"),
    ((2, 128), torch.int64, "'key' has 2 tokens but 'slot_mapping' has 3"),
])
def test_reshape_and_cache_bad_input_is_a_clear_error(key_shape, slot_dtype, message):
    kv_cache = torch.empty(2, 4, 16, 2, 64, dtype=torch.float16, device="meta")
    key = torch.empty(*key_shape, dtype=torch.float16, device="meta")
    slots = torch.empty(3, dtype=slot_dtype, device="meta")
    with pytest.raises(RuntimeError, match=re.escape(f"reshape_and_cache: {message}")):
        torch.ops._C.reshape_and_cache(key, key, kv_cache, slots)
