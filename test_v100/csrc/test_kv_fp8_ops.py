"""FP8 KV cache in the CUDA kernels (float8_e4m3fn / float8_e5m2 caches), against torch's float8
dtypes and float64 references:
- the decode kernels' software FP8 -> FP16 / BF16 decoding on all 256 byte values (tensor-core
  and CUDA-core kernels), through a one-token context whose value row holds them;
- reshape_and_cache's quantization: torch's ``.to(float8)`` of x / scale, bit for bit;
- paged decode over FP8 caches against a float64 reference of the dequantized cache;
- the argument checks (Meta kernels: run on CPU too)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from vllm_volta import _custom_ops as ops

from .op_cases import TOLERANCES, requires_gpu
from .test_attention_ops import decode_reference, random_block_table

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
gpu = [pytest.mark.gpu, requires_gpu]


def _skip_unbuilt(dtype) -> None:
    if dtype == torch.bfloat16 and not (torch.cuda.get_device_capability() >= (8, 0) and ops.cuda_bf16_kernels_built()):
        pytest.skip("bfloat16 needs a GPU of compute capability >= 8.0 and a build targeting it")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("partition_size", [256, 48], ids=["tensor-cores", "cuda-cores"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", FP8)
def test_every_fp8_byte_decodes_as_torch_does(cache_dtype, dtype, partition_size):
    """Two one-token sequences, keys 0: each output row is its value row, bytes 0..127 and 128..255
    (v_scale 1): exactly torch's conversion of each byte (NaN bytes NaN, e5m2's infinities inf)."""
    _skip_unbuilt(dtype)
    d = 128
    cache = torch.zeros(2, 4, 16, 1, d, dtype=torch.uint8, device="cuda")
    cache[1, 1, 0, 0] = torch.arange(0, 128, dtype=torch.uint8)
    cache[1, 2, 0, 0] = torch.arange(128, 256, dtype=torch.uint8)
    cache = cache.view(cache_dtype)
    table = torch.tensor([[1], [2]], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, d, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    ops.paged_attention_decode(out, q, cache, table, torch.tensor([1, 1], dtype=torch.int32, device="cuda"),
                               d ** -0.5, 1, partition_size, 128)
    expected = torch.arange(256, dtype=torch.uint8).view(cache_dtype).to(dtype).view(2, 1, d)
    got = out.cpu()
    assert torch.equal(got.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(got[finite], expected[finite])


def _scaled_values(n: int, kv_heads: int, d: int, dtype) -> torch.Tensor:
    """Values over FP8's whole range: normal, subnormal after scaling, saturating, and exact ties."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, kv_heads, d, generator=gen) * torch.logspace(-6, 5, n).view(n, 1, 1)
    x[0, 0, :8] = torch.tensor([1.0625, 1.1875, -1.125, 1.375, 448.0, 464.0, 57344.0, 61440.0])
    return x.to(dtype)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.37, 3.0), (2.0 ** -6, 0.011)])
def test_reshape_and_cache_quantizes_like_torch(cache_dtype, dtype, scales):
    _skip_unbuilt(dtype)
    kv_heads, d, n = 2, 64, 40
    key, value = _scaled_values(n, kv_heads, d, dtype), -_scaled_values(n, kv_heads, d, dtype).flip(0)
    cache = torch.zeros(2, 6, 8, kv_heads, d, dtype=cache_dtype, device="cuda")
    slots = torch.randperm(48)[:n]
    slots[5] = -1  # padding: not written
    ops.reshape_and_cache(key.cuda(), value.cuda(), cache, slots.cuda(), *scales)
    limit = torch.finfo(cache_dtype).max
    written = cache.cpu().view(torch.uint8)
    for half, x, scale in ((0, key, scales[0]), (1, value, scales[1])):
        # Elementwise IEEE division in float32 (no scalar fast path), clamped, then torch's rounding.
        x32 = x.float()
        ref = (x32 / torch.full_like(x32, scale)).clamp(-limit, limit).to(cache_dtype).view(torch.uint8)
        got = written[half].view(-1, kv_heads, d)
        valid = slots >= 0
        assert torch.equal(got[slots[valid]], ref[valid])
        untouched = torch.ones(48, dtype=torch.bool)
        untouched[slots[valid]] = False
        assert not got[untouched].any()


FP8_DECODE_CASES = [
    # (dtype, head_size, num_heads, kv_heads, seq_lens, partition_size, num_threads, window, soft_cap)
    (torch.float16, 128, 32, 8, [1, 17, 64, 600, 1333], 512, 128, None, None),  # tensor cores, split contexts
    (torch.float16, 128, 12, 2, [5, 300, 1024], 256, 96, None, None),  # GQA 6 -> 6 heads per block
    (torch.float16, 64, 9, 3, [3, 40, 129], 32, 128, None, None),  # tiny partitions, GQA 3
    (torch.float16, 96, 8, 8, [33, 95], 1024, 512, None, None),  # MHA, one partition
    (torch.float16, 256, 16, 2, [200, 513], 128, 128, None, None),
    (torch.float16, 512, 32, 4, [1, 100, 1500], 256, 128, None, None),  # Gemma 4's full layers
    (torch.float16, 128, 32, 8, [3000] * 40 + [5, 2500], 1024, 192, None, None),  # waves, longer partitions
    (torch.float16, 128, 32, 8, [70, 400], 48, 128, None, None),  # CUDA cores (half tiles)
    (torch.float16, 512, 4, 2, [70, 400], 48, 128, None, None),
    (torch.float16, 256, 8, 4, [3, 600, 1500, 5000], 1024, 192, 4096, 50.0),  # window and soft cap
    (torch.float16, 128, 32, 8, [70, 400, 1000], 48, 128, 90, 2.0),  # both, CUDA cores
    (torch.bfloat16, 128, 32, 8, [100, 900], 512, 128, None, None),
    (torch.bfloat16, 128, 12, 2, [70, 400], 48, 512, None, None),
]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype,head_size,num_heads,kv_heads,seq_lens,partition_size,num_threads,window,soft_cap",
                         FP8_DECODE_CASES)
@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("block_size", [16, 24])
def test_paged_decode_over_an_fp8_cache_matches_float64(dtype, head_size, num_heads, kv_heads, seq_lens,
                                                        partition_size, num_threads, window, soft_cap, cache_dtype,
                                                        block_size):
    """The reference attends over the dequantized cache (its values times k_scale / v_scale) in
    float64; the kernels then differ from it by their own rounding only, as for FP16 caches."""
    _skip_unbuilt(dtype)
    k_scale, v_scale = 0.7, 0.045
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    width = -(-(max(seq_lens) + 300) // block_size)
    gen = torch.Generator().manual_seed(5)
    # Keys / values of a few units after scaling: FP8's full mantissa range is used.
    raw = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen) * 4
    cache = raw.clamp(-torch.finfo(cache_dtype).max, torch.finfo(cache_dtype).max).to(cache_dtype).cuda()
    table = random_block_table(seq_lens, block_size, num_blocks, width).cuda()
    qkv = torch.randn(len(seq_lens), (num_heads + 2 * kv_heads) * head_size, dtype=dtype, device="cuda")
    q = qkv[:, : num_heads * head_size].view(len(seq_lens), num_heads, head_size)
    scale = 1.0 / math.sqrt(head_size)
    out = torch.full_like(q, float("nan")).contiguous()
    ops.paged_attention_decode(out, q, cache, table, torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
                               scale, max(seq_lens) + 300, partition_size, num_threads, sliding_window=window,
                               logits_soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale)
    dequantized = torch.stack([cache[0].cpu().double() * k_scale, cache[1].cpu().double() * v_scale])
    ref = decode_reference(q, dequantized, table, seq_lens, scale, window, soft_cap)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.cpu().double(), ref, **{k: v * 2 for k, v in tol.items()})


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("cache_dtype", FP8)
def test_fp8_ops_pass_opcheck(cache_dtype):
    key = torch.randn(3, 2, 64, dtype=torch.float16, device="cuda")
    cache = torch.zeros(2, 4, 16, 2, 64, dtype=cache_dtype, device="cuda")
    torch.library.opcheck(torch.ops._C.reshape_and_cache.default,
                          (key, key.clone(), cache, torch.tensor([1, 7, 20], device="cuda"), 0.5, 2.0))
    q = torch.randn(2, 4, 64, dtype=torch.float16, device="cuda")
    table = random_block_table([20, 40], 16, 4, 4).cuda()
    seq_lens = torch.tensor([20, 40], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops._C.paged_attention_decode.default,
                          (torch.empty_like(q), q, cache, table, seq_lens, 0.125, 64, 32, 128, 0, 0.0, 0.5, 2.0))


@pytest.mark.gpu
@requires_gpu
def test_float32_queries_over_an_fp8_cache_are_a_clear_error():
    cache = torch.zeros(2, 4, 16, 2, 64, dtype=torch.float8_e4m3fn, device="cuda")
    q = torch.randn(1, 2, 64, device="cuda")
    with pytest.raises(RuntimeError, match="an FP8 'kv_cache' needs float16 or bfloat16 'query'"):
        ops.paged_attention_decode(torch.empty_like(q), q, cache, torch.zeros(1, 1, dtype=torch.int32, device="cuda"),
                                   torch.ones(1, dtype=torch.int32, device="cuda"), 0.125, 1)


def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("cache_dtype", FP8)
def test_meta_checks_accept_fp8_caches(cache_dtype):
    cache = _meta(2, 10, 16, 2, 128, dtype=cache_dtype)
    key = _meta(3, 2, 128)
    torch.ops._C.reshape_and_cache(key, key, cache, _meta(3, dtype=torch.int64), 0.5, 2.0)
    torch.ops._C.paged_attention_decode(_meta(2, 8, 128), _meta(2, 8, 128), cache, _meta(2, 4, dtype=torch.int32),
                                        _meta(2, dtype=torch.int32), 0.1, 64, 512, 128, 0, 0.0, 0.5, 2.0)


BAD = [
    (dict(k_scale=0.0), "reshape_and_cache: 'k_scale' must be a finite value > 0"),
    (dict(v_scale=float("inf")), "reshape_and_cache: 'v_scale' must be a finite value > 0"),
    (dict(value=_meta(3, 2, 128, dtype=torch.float32)), "reshape_and_cache: 'value' has dtype float32 but 'key'"),
    (dict(key=_meta(3, 2, 128, dtype=torch.int32), value=_meta(3, 2, 128, dtype=torch.int32)),
     "reshape_and_cache: 'key' must be float32, float16 or bfloat16"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_fp8_write_arguments_are_clear_errors(overrides, message):
    args = dict(key=_meta(3, 2, 128), value=_meta(3, 2, 128), kv_cache=_meta(2, 10, 16, 2, 128, dtype=torch.float8_e4m3fn),
                slot_mapping=_meta(3, dtype=torch.int64), k_scale=1.0, v_scale=1.0)
    args.update(overrides)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops._C.reshape_and_cache(**args)


def test_fused_rotary_write_refuses_fp8_caches():
    """rotary_embedding_and_cache writes the cache's own dtype: an FP8 cache goes through
    rotary_embedding + reshape_and_cache (the VOLTA_PAGED backend does so)."""
    cache = _meta(2, 10, 16, 2, 64, dtype=torch.float8_e4m3fn)
    q, k = _meta(3, 4 * 64), _meta(3, 2 * 64)
    with pytest.raises(RuntimeError, match="'kv_cache' must be float32, float16, bfloat16, got an FP8 dtype"):
        torch.ops._C.rotary_embedding_and_cache(_meta(3, dtype=torch.int64), q, k, k, cache,
                                                _meta(3, dtype=torch.int64), 64, _meta(32, 64, dtype=torch.float32),
                                                True)
