"""rotary_embedding (CUDA kernel, in place) vs RotaryEmbedding.forward_native, bit for bit, and
its argument checks (Meta kernel: runs on CPU too)."""

from __future__ import annotations

import re

import pytest
import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope

from .op_cases import requires_gpu

MAX_POSITION = 4096
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def skip_without_bf16(dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not (torch.cuda.get_device_capability() >= (8, 0)
                                        and ops.cuda_bf16_kernels_built()):
        pytest.skip("bfloat16 needs a GPU of compute capability >= 8.0 and a build targeting it")


def qkv_views(num_tokens: int, heads: int, kv_heads: int, head_size: int, dtype: torch.dtype,
              layout: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """query/key as the model sees them. layout: 'qkv' (column views of a fused [T, (H+2KH)*D]
    output, 2-D), 'qkv-3d' (the same viewed [T, heads, D]), 'contiguous', or 'odd-offset'
    (views starting one element into their buffer: no vector access is aligned)."""
    gen = torch.Generator().manual_seed(seed)
    q_width, kv_width = heads * head_size, kv_heads * head_size
    if layout in ("qkv", "qkv-3d"):
        qkv = torch.randn(num_tokens, q_width + 2 * kv_width, generator=gen).to(dtype).cuda()
        q, k, _ = qkv.split([q_width, kv_width, kv_width], dim=-1)
        if layout == "qkv-3d":
            q, k = q.view(num_tokens, heads, head_size), k.view(num_tokens, kv_heads, head_size)
        return q, k
    if layout == "odd-offset":
        q_buf = torch.randn(num_tokens, q_width + 1, generator=gen).to(dtype).cuda()
        k_buf = torch.randn(num_tokens, kv_width + 1, generator=gen).to(dtype).cuda()
        return q_buf[:, 1:], k_buf[:, 1:]
    q = torch.randn(num_tokens, q_width, generator=gen).to(dtype).cuda()
    return q, torch.randn(num_tokens, kv_width, generator=gen).to(dtype).cuda()


def random_positions(num_tokens: int, dtype: torch.dtype = torch.int64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, MAX_POSITION, (num_tokens,), generator=gen, dtype=torch.int64).to(dtype).cuda()


def check_against_native(rope: RotaryEmbedding, positions: torch.Tensor, q: torch.Tensor,
                         k: torch.Tensor | None, cache: torch.Tensor | None = None) -> None:
    """Run the op in place on q/k and compare to forward_native on copies, exactly."""
    cache = rope.cos_sin_cache if cache is None else cache
    q_ref, k_ref = rope.forward_native(positions, q.clone(), None if k is None else k.clone())
    ops.rotary_embedding(positions, q, k, rope.head_size, cache, rope.is_neox_style)
    # flatten(1), not reshape(T, -1): the latter is ambiguous for 0 tokens.
    assert torch.equal(q.flatten(1), q_ref), (q.flatten(1) - q_ref).abs().max()
    if k is not None:
        assert torch.equal(k.flatten(1), k_ref), (k.flatten(1) - k_ref).abs().max()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("partial", [False, True], ids=["full-rot", "half-rot"])
@pytest.mark.parametrize("layout", ["qkv", "qkv-3d", "contiguous", "odd-offset"])
def test_matches_forward_native_exactly(dtype, is_neox, head_size, partial, layout):
    skip_without_bf16(dtype)
    rot_dim = head_size // 2 if partial else head_size
    rope = get_rope(head_size, rot_dim, MAX_POSITION, 10000.0, is_neox).cuda()
    heads, kv_heads, num_tokens = 6, 2, 37
    q, k = qkv_views(num_tokens, heads, kv_heads, head_size, dtype, layout)
    pos_dtype = torch.int32 if layout == "contiguous" else torch.int64  # int32 positions are accepted too
    check_against_native(rope, random_positions(num_tokens, pos_dtype), q, k)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_key_none_only_rotates_query(dtype, is_neox):
    skip_without_bf16(dtype)
    rope = get_rope(128, 128, MAX_POSITION, 500000.0, is_neox).cuda()
    q, k = qkv_views(9, 4, 2, 128, dtype, "qkv")
    k_before = k.clone()
    check_against_native(rope, random_positions(9), q, None)
    assert torch.equal(k, k_before)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_cache_in_query_dtype(dtype, is_neox):
    """A table already in the activation dtype (e.g. after module.to(dtype)) gives the same result."""
    skip_without_bf16(dtype)
    rope = get_rope(64, 64, MAX_POSITION, 10000.0, is_neox).cuda()
    rope.cos_sin_cache = rope.cos_sin_cache.to(dtype)
    q, k = qkv_views(11, 4, 4, 64, dtype, "qkv")
    check_against_native(rope, random_positions(11), q, k)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
], ids=["linear", "llama3", "yarn"])
def test_scaled_tables(scaling):
    rope = get_rope(128, 128, MAX_POSITION, 500000.0, True, scaling).cuda()
    q, k = qkv_views(21, 8, 2, 128, torch.float16, "qkv")
    check_against_native(rope, random_positions(21), q, k)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("num_tokens", [0, 1, 3000])
def test_token_counts(num_tokens):
    rope = get_rope(128, 128, MAX_POSITION, 10000.0, True).cuda()
    q, k = qkv_views(num_tokens, 32, 8, 128, torch.float16, "qkv")
    check_against_native(rope, random_positions(num_tokens), q, k)


@pytest.mark.gpu
@requires_gpu
def test_odd_head_count_and_small_rot_dim():
    """Head/rot sizes that force narrow vectors: head_size 80 with rot_dim 20 and 2 (GPT-J too)."""
    for rot_dim, is_neox in ((20, True), (20, False), (2, True), (2, False)):
        rope = get_rope(80, rot_dim, MAX_POSITION, 10000.0, is_neox).cuda()
        q, k = qkv_views(5, 3, 1, 80, torch.float16, "qkv")
        check_against_native(rope, random_positions(5), q, k)


@pytest.mark.gpu
@requires_gpu
def test_out_of_range_position_leaves_token_unchanged():
    rope = get_rope(64, 64, 16, 10000.0, True).cuda()
    q, k = qkv_views(3, 2, 2, 64, torch.float16, "contiguous")
    q_before, k_before = q.clone(), k.clone()
    ops.rotary_embedding(torch.tensor([16, -1, 3], device="cuda"), q, k, 64, rope.cos_sin_cache, True)
    assert torch.equal(q[:2], q_before[:2]) and torch.equal(k[:2], k_before[:2])
    assert not torch.equal(q[2], q_before[2])


@pytest.mark.gpu
@requires_gpu
def test_cuda_graph_replay_follows_positions():
    rope = get_rope(128, 128, MAX_POSITION, 10000.0, True).cuda()
    positions = random_positions(4)
    q, k = qkv_views(4, 8, 2, 128, torch.float16, "qkv")
    q_in, k_in = q.clone(), k.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.rotary_embedding(positions, q, k, 128, rope.cos_sin_cache, True)
    for seed in (1, 2):
        positions.copy_(random_positions(4, seed=seed))
        q.copy_(q_in)
        k.copy_(k_in)
        graph.replay()
        q_ref, k_ref = rope.forward_native(positions, q_in, k_in)
        assert torch.equal(q, q_ref) and torch.equal(k, k_ref)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_rotary_opcheck(with_key):
    # test_aot_dispatch_dynamic is left to the meta-tensor opcheck below: on torch 2.11 (the GPU
    # image) auto_functionalized_v2 segfaults inside FakeTensor dispatch for this mutable optional
    # `Tensor!? key` with CUDA fake tensors (seen on the H200; the same check passes on meta
    # tensors with torch 2.11 and 2.13). The engine never traces this op.
    rope = get_rope(64, 64, 256, 10000.0, False).cuda()
    q = torch.randn(5, 4 * 64, dtype=torch.float16, device="cuda")
    k = torch.randn(5, 2, 64, dtype=torch.float16, device="cuda") if with_key else None
    positions = torch.tensor([0, 7, 255, 3, 100], device="cuda")
    torch.library.opcheck(torch.ops._C.rotary_embedding.default, (positions, q, k, 64, rope.cos_sin_cache, False),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_rotary_opcheck_on_meta_tensors(with_key):
    """Every opcheck test, aot_dispatch_dynamic included, through the Meta kernel (CPU and CI)."""
    q = torch.randn(5, 4 * 64, dtype=torch.float16, device="meta")
    k = torch.randn(5, 2, 64, dtype=torch.float16, device="meta") if with_key else None
    positions = torch.zeros(5, dtype=torch.int64, device="meta")
    cache = torch.empty(256, 64, device="meta")
    torch.library.opcheck(torch.ops._C.rotary_embedding.default, (positions, q, k, 64, cache, False))


@pytest.mark.gpu
@requires_gpu
def test_bf16_without_bf16_kernels_is_a_clear_error():
    if ops.cuda_bf16_kernels_built() and torch.cuda.get_device_capability() >= (8, 0):
        pytest.skip("this build and GPU have bf16 kernels")
    q = torch.randn(2, 64, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(8, 64, device="cuda")
    with pytest.raises(RuntimeError, match="rotary_embedding: bfloat16"):
        ops.rotary_embedding(torch.tensor([0, 1], device="cuda"), q, None, 64, cache, True)


# ---- argument checks (Meta kernel; no GPU needed) ----

def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _meta_args(**overrides):
    args = dict(positions=_meta(4, dtype=torch.int64), query=_meta(4, 8 * 64), key=_meta(4, 2 * 64),
                head_size=64, cos_sin_cache=_meta(100, 64, dtype=torch.float32), is_neox=True)
    args.update(overrides)
    return args


BAD_ARGS = [
    (dict(query=_meta(4, 8 * 64, dtype=torch.int32)), "'query' must be float32, float16 or bfloat16"),
    (dict(head_size=0), "'head_size' must be > 0"),
    (dict(positions=_meta(4, dtype=torch.float32)), "'positions' must be int64 or int32"),
    (dict(positions=_meta(5, dtype=torch.int64)), "'query' has 4 tokens but 'positions' has 5"),
    (dict(positions=torch.empty(4, dtype=torch.int64)), "'positions' and 'query' must be on the same device"),
    (dict(positions=_meta(4, 2, dtype=torch.int64)[:, 0]), "'positions' must be contiguous"),
    (dict(cos_sin_cache=_meta(100, 64, dtype=torch.bfloat16)),
     "'cos_sin_cache' must be float32 or the dtype of 'query' (float16), got bfloat16"),
    (dict(cos_sin_cache=_meta(100, 64, 1, dtype=torch.float32)), "'cos_sin_cache' must be [max_position, rot_dim]"),
    (dict(cos_sin_cache=_meta(100, 65, dtype=torch.float32)), "rot_dim (last dim of 'cos_sin_cache', 65) must be even"),
    (dict(cos_sin_cache=_meta(100, 66, dtype=torch.float32)),
     "rot_dim (last dim of 'cos_sin_cache', 66) must be even and in [2, head_size=64]"),
    (dict(cos_sin_cache=_meta(64, 100, dtype=torch.float32).t()), "'cos_sin_cache' must be contiguous in its last"),
    (dict(query=_meta(4, 8, 64, 1)), "'query' must be [num_tokens, num_heads * head_size] or"),
    (dict(query=_meta(4, 500)), "last dim of 'query' (500) must be a multiple of head_size (64)"),
    (dict(query=_meta(4, 8, 32)), "last dim of 'query' (32) must equal head_size (64)"),
    (dict(query=_meta(4, 64, 8).transpose(1, 2)), "'query' must be contiguous within each token"),
    (dict(query=_meta(512, 4).t()), "'query' must be contiguous within each token"),
    (dict(key=_meta(4, 2 * 64, dtype=torch.float32)), "'key' has dtype float32 but 'query' has float16"),
    (dict(key=torch.empty(4, 2 * 64, dtype=torch.float16)), "'key' and 'query' must be on the same device"),
    (dict(key=_meta(3, 2 * 64)), "'key' has 3 tokens but 'positions' has 4"),
    (dict(key=_meta(4, 100)), "last dim of 'key' (100) must be a multiple of head_size (64)"),
]


@pytest.mark.parametrize("overrides,message", BAD_ARGS)
def test_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"rotary_embedding: {message}")):
        torch.ops._C.rotary_embedding(**_meta_args(**overrides))


@pytest.mark.parametrize("overrides", [
    {},
    dict(key=None),
    dict(positions=_meta(2, 2, dtype=torch.int32)),
    dict(query=_meta(4, 8, 64), key=_meta(4, 2, 64)),
    dict(query=_meta(4, 8 * 64 + 2 * 2 * 64)[:, : 8 * 64], key=_meta(4, 8 * 64 + 2 * 2 * 64)[:, 8 * 64: 10 * 64]),
    dict(cos_sin_cache=_meta(100, 32)),  # float16 table = query dtype; partial rotation
    dict(positions=_meta(0, dtype=torch.int64), query=_meta(0, 8 * 64), key=None),
], ids=["default", "no-key", "int32-2d-positions", "3d", "qkv-views", "fp16-partial-table", "empty"])
def test_valid_meta_args_are_accepted(overrides):
    torch.ops._C.rotary_embedding(**_meta_args(**overrides))


# ---- rotary_embedding_and_cache: the same rotation, then reshape_and_cache, in one kernel ----

def _fused_case(dtype, layout, head_size=128, num_tokens=19, seed=0):
    heads, kv_heads, block_size, num_blocks = 6, 2, 16, 8
    gen = torch.Generator().manual_seed(seed)
    q, k = qkv_views(num_tokens, heads, kv_heads, head_size, dtype, layout, seed)
    v = torch.randn(num_tokens, kv_heads * head_size, generator=gen).to(dtype).cuda()
    kv_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen).to(dtype).cuda()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[3] = -1  # a padding token: no cache write
    return q, k, v, kv_cache, slots.cuda()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("partial", [False, True], ids=["full-rot", "half-rot"])
@pytest.mark.parametrize("layout", ["qkv", "contiguous", "odd-offset"])
def test_fused_cache_write_equals_the_two_ops(dtype, is_neox, partial, layout):
    skip_without_bf16(dtype)
    rope = get_rope(128, 64 if partial else 128, MAX_POSITION, 10000.0, is_neox).cuda()
    q, k, v, kv_cache, slots = _fused_case(dtype, layout)
    positions = random_positions(q.shape[0])
    q_ref, k_ref, cache_ref = q.clone(), k.clone(), kv_cache.clone()
    ops.rotary_embedding(positions, q_ref, k_ref, 128, rope.cos_sin_cache, is_neox)
    ops.reshape_and_cache(k_ref, v, cache_ref, slots)
    ops.rotary_embedding_and_cache(positions, q, k, v, kv_cache, slots, 128, rope.cos_sin_cache, is_neox)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(kv_cache, cache_ref)


@pytest.mark.gpu
@requires_gpu
def test_fused_cache_write_replays_in_a_cuda_graph():
    rope = get_rope(128, 128, MAX_POSITION, 10000.0, True).cuda()
    q, k, v, kv_cache, slots = _fused_case(torch.float16, "qkv", num_tokens=4, seed=1)
    positions = random_positions(4, seed=1)
    ops.rotary_embedding_and_cache(positions, q, k, v, kv_cache, slots, 128, rope.cos_sin_cache, True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.rotary_embedding_and_cache(positions, q, k, v, kv_cache, slots, 128, rope.cos_sin_cache, True)
    fresh_q, fresh_k, _, _, new_slots = _fused_case(torch.float16, "qkv", num_tokens=4, seed=2)
    q.copy_(fresh_q), k.copy_(fresh_k), slots.copy_(new_slots), positions.copy_(random_positions(4, seed=3))
    q_ref, k_ref, cache_ref = q.clone(), k.clone(), kv_cache.clone()
    ops.rotary_embedding(positions, q_ref, k_ref, 128, rope.cos_sin_cache, True)
    ops.reshape_and_cache(k_ref, v, cache_ref, slots)
    graph.replay()
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref) and torch.equal(kv_cache, cache_ref)


def _fused_meta_args(**overrides):
    meta = dict(device="meta", dtype=torch.float16)
    args = dict(positions=torch.empty(5, dtype=torch.int64, device="meta"), query=torch.empty(5, 4 * 64, **meta),
                key=torch.empty(5, 2 * 64, **meta), value=torch.empty(5, 2 * 64, **meta),
                kv_cache=torch.empty(2, 4, 16, 2, 64, **meta), slot_mapping=torch.empty(5, dtype=torch.int64, device="meta"),
                head_size=64, cos_sin_cache=torch.empty(MAX_POSITION, 64, dtype=torch.float32, device="meta"),
                is_neox=True)
    args.update(overrides)
    return args


FUSED_BAD_ARGS = [
    (dict(slot_mapping=torch.empty(4, dtype=torch.int64, device="meta")), "'slot_mapping' has 4 tokens but 'positions' has 5"),
    (dict(value=torch.empty(5, 3 * 64, dtype=torch.float16, device="meta")), "'value' must be [num_tokens, 2, 64]"),
    (dict(kv_cache=torch.empty(2, 4, 16, 2, 64, dtype=torch.float32, device="meta")), "'key' has dtype float16 but 'kv_cache' has float32"),
    (dict(key=torch.empty(4, 2 * 64, dtype=torch.float16, device="meta")), "'key' has 4 tokens but 'positions' has 5"),
]


@pytest.mark.parametrize("overrides,message", FUSED_BAD_ARGS)
def test_fused_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"rotary_embedding_and_cache: {message}")):
        torch.ops._C.rotary_embedding_and_cache(**_fused_meta_args(**overrides))


def test_fused_valid_meta_args_pass():
    torch.ops._C.rotary_embedding_and_cache(**_fused_meta_args())
