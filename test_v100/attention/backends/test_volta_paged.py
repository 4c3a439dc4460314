"""VOLTA_PAGED vs the universal TORCH_SDPA backend through the Attention layer (same q/k/v, same
starting cache): decode, prefill, prefix hits, mixed batches, GQA, and CUDA-graph replay."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_volta.attention.backends.torch_sdpa import TorchSDPABackend
from vllm_volta.attention.backends.volta_paged import (VoltaPagedBackend, _build_plan, choose_prefill_kernel,
                                                        default_launch_config, heads_per_block, repeat_heads)
from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import build_attn_metadata
from vllm_volta.platforms.interface import DeviceCapability

BLOCK_SIZE = 16
TOL = {torch.float16: dict(atol=4e-3, rtol=4e-3), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float32: dict(atol=2e-4, rtol=2e-4)}


def _validate(**kw):
    args = dict(capability=DeviceCapability(7, 0), dtype=torch.float16, head_size=128, device_type="cuda")
    args.update(kw)
    return VoltaPagedBackend.validate(**args)


def test_validate_reasons():
    assert _validate(device_type="cpu")[0] == "needs a CUDA device, got 'cpu'"
    assert any("head_size 80 is not supported" in r for r in _validate(head_size=80))
    assert any("bfloat16 needs compute capability >= 8.0, got 7.0" in r for r in _validate(dtype=torch.bfloat16))
    assert any("needs compute capability >= 7.0, got 6.1" in r for r in _validate(capability=DeviceCapability(6, 1)))
    assert any("dtype torch.int8" in r for r in _validate(dtype=torch.int8))
    if not torch._C._dispatch_has_kernel_for_dispatch_key("_C::paged_attention_decode", "CUDA"):
        assert any("built without CUDA kernels" in r for r in _validate())
    else:
        from vllm_volta._custom_ops import cuda_bf16_kernels_built

        assert _validate() == []
        bf16 = _validate(capability=DeviceCapability(9, 0), dtype=torch.bfloat16)
        assert bf16 == ([] if cuda_bf16_kernels_built() else
                        ["bfloat16 kernels are not built (every arch in TORCH_CUDA_ARCH_LIST is below 8.0)"])


def _layers(num_heads, num_kv_heads, head_size, **kw):
    scale = 1 / math.sqrt(head_size)
    return (Attention(num_heads, head_size, scale, num_kv_heads, backend_cls=VoltaPagedBackend, **kw),
            Attention(num_heads, head_size, scale, num_kv_heads, backend_cls=TorchSDPABackend, **kw))


def _inputs(seqs, num_heads, num_kv_heads, head_size, dtype, seed=0, num_blocks=None):
    """seqs: (num_computed, num_new) per sequence. A random cache (holding every prefix), a
    metadata over shuffled blocks, and q/k/v sliced out of one fused projection output."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-(c + n) // BLOCK_SIZE) for c, n in seqs]
    num_blocks = num_blocks or sum(need) + 2
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    block_ids, used = [], 0
    for n in need:
        block_ids.append(perm[used:used + n])
        used += n
    md = build_attn_metadata([c for c, _ in seqs], [n for _, n in seqs], block_ids, BLOCK_SIZE, "cuda")
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_size, generator=g).to(dtype).cuda()
    tokens = md.num_actual_tokens
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_size, generator=g).to(dtype).cuda()
    q, k, v = qkv.split([num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], dim=1)
    return q, k, v, cache, md


CASES = {
    "decode": [(0, 1), (16, 1), (599, 1), (1332, 1)],
    "prefill": [(0, 5), (0, 37), (0, 16)],
    "prefix-hit": [(32, 20), (5, 9), (0, 12)],
    "mixed": [(100, 1), (0, 13), (48, 1), (7, 30), (2047, 1)],
    "decodes-then-prefills": [(100, 1), (48, 1), (0, 13), (7, 30)],
    "interleaved": [(0, 3), (4, 2), (0, 5)],  # fresh prompts around a continued one
}


def test_prefill_kernel_choice():
    fp16, fp32 = torch.float16, torch.float32
    assert choose_prefill_kernel(DeviceCapability(7, 0), fp16)[0] == "efficient"
    assert choose_prefill_kernel(DeviceCapability(7, 5), fp16)[0] == "efficient"
    assert choose_prefill_kernel(None, fp16)[0] == "efficient"
    kernel, why = choose_prefill_kernel(DeviceCapability(9, 0), fp32)
    assert kernel == "efficient" and "fp16/bf16" in why
    expected = "flash" if torch.backends.cuda.is_flash_attention_available() else "efficient"
    assert choose_prefill_kernel(DeviceCapability(8, 0), fp16)[0] == expected
    kernel, why = choose_prefill_kernel(DeviceCapability(9, 0), fp16, head_size=512)
    assert kernel == "efficient" and "512" in why


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["contiguous", "qkv-slice", "odd-offset"])
def test_repeat_heads_matches_repeat_interleave(dtype, layout):
    """Word-sized copies where the rows allow (the k / v slices of a fused projection), the
    entry-by-entry copy where they do not (an odd offset): both are repeat_interleave."""
    kh, d, times = 2, 64, 6
    qkv = torch.randn(9, (times + 2) * kh * d).to(dtype)
    x = {"contiguous": torch.randn(9, kh, d).to(dtype),
         "qkv-slice": qkv[:, times * kh * d:(times + 1) * kh * d].view(9, kh, d),
         "odd-offset": qkv[:, 1:1 + kh * d].view(9, kh, d)}[layout]
    assert torch.equal(repeat_heads(x, times), x.repeat_interleave(times, dim=1))


def _plan(seqs, tables=None):
    tables = tables or [list(range(1, 2 + (c + n) // BLOCK_SIZE)) for c, n in seqs]
    md = build_attn_metadata([c for c, _ in seqs], [n for _, n in seqs], tables, BLOCK_SIZE, "cpu")
    return _build_plan(md, BLOCK_SIZE), md


@pytest.mark.parametrize("case, expected_rows", [
    ("prefill", [slice(0, 58)]),
    ("prefix-hit", [slice(0, 29), slice(29, 41)]),
    ("mixed", [slice(15, 45), slice(1, 14)]),
    ("decodes-then-prefills", [slice(15, 45), slice(2, 15)]),
    ("interleaved", [slice(3, 5), [0, 1, 2, 5, 6, 7, 8, 9]]),
])
def test_plan_parts_use_slices_when_rows_are_back_to_back(case, expected_rows):
    """Sequences with a cached prefix form the first part, the others the second; each part's
    query rows are a slice when back to back, else token indices."""
    plan, _ = _plan(CASES[case])
    got = [p.rows if isinstance(p.rows, slice) else p.rows.tolist() for p in plan.prefills]
    assert got == expected_rows


@pytest.mark.parametrize("case, expected_rows", [
    ("decodes-then-prefills", slice(0, 2)), ("mixed", [0, 14, 45]), ("prefill", None),
])
def test_plan_decode_rows_are_a_slice_when_decodes_lead(case, expected_rows):
    """Leading decode rows are views of the step's rows, others are gathered; either way the
    block tables and lengths are those of the decode sequences."""
    seqs = CASES[case]
    plan, md = _plan(seqs)
    if expected_rows is None:
        assert plan.decode_rows is None
        return
    rows = plan.decode_rows
    assert rows == expected_rows if isinstance(expected_rows, slice) else rows.tolist() == expected_rows
    decodes = [i for i, (_, n) in enumerate(seqs) if n == 1]
    assert plan.decode_seq_lens.tolist() == [seqs[i][0] + 1 for i in decodes]
    assert torch.equal(plan.decode_block_table, md.block_table[decodes])
    assert plan.decode_max_len == max(seqs[i][0] + 1 for i in decodes)


@pytest.mark.parametrize("case", ["prefill", "prefix-hit", "mixed", "interleaved"])
def test_plan_sequence_bounds_and_context_slots(case):
    """Per part: cu_seqlens over its sequences' new tokens (q) and whole contexts (k), and the
    cache slot of every context token where some of it was computed before."""
    seqs = CASES[case]
    tables = [[7 * i + 3 + b for b in range(1 + (c + n) // BLOCK_SIZE)] for i, (c, n) in enumerate(seqs)]
    plan, _ = _plan(seqs, tables)
    cached = [i for i, (c, n) in enumerate(seqs) if n > 1 and c > 0]
    fresh = [i for i, (c, n) in enumerate(seqs) if n > 1 and c == 0]
    groups = [g for g in (cached, fresh) if g]
    assert len(plan.prefills) == len(groups)
    bounds = lambda lens: [sum(lens[:j]) for j in range(len(lens) + 1)]  # noqa: E731
    for part, group in zip(plan.prefills, groups):
        q_lens = [seqs[i][1] for i in group]
        k_lens = [seqs[i][0] + seqs[i][1] for i in group]
        assert part.cu_seqlens_q.dtype == torch.int32 and part.cu_seqlens_q.tolist() == bounds(q_lens)
        assert part.cu_seqlens_k.tolist() == bounds(k_lens)
        assert (part.max_q, part.max_k) == (max(q_lens), max(k_lens))
        if group is fresh:
            assert part.context_slots is None
        else:
            expected = [tables[i][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
                        for i in group for pos in range(seqs[i][0] + seqs[i][1])]
            assert part.context_slots.tolist() == expected


@pytest.mark.parametrize("group,expected", [(1, 1), (4, 4), (6, 6), (8, 8), (12, 6), (16, 8), (24, 8), (28, 7),
                                             (9, 3), (10, 5)])
def test_heads_per_block_is_the_largest_even_split_of_a_group_into_at_most_8(group, expected):
    assert heads_per_block(group) == expected


@pytest.mark.parametrize("num_seqs,num_heads,num_kv_heads,num_sms,partition,threads", [
    (1, 12, 2, 80, 128, 128),      # Qwen2.5-1.5B on a V100 at batch 1: 2 blocks
    (16, 12, 2, 80, 128, 128),     # 32 blocks = 0.4 per SM
    (32, 12, 2, 80, 256, 128),     # 64 = 0.8 per SM
    (1, 32, 8, 80, 128, 128),      # Llama-3-8B: 8 blocks per sequence
    (16, 32, 8, 80, 256, 128),     # 128 = 1.6 per SM
    (20, 32, 8, 80, 1024, 192),    # 160 = 2 per SM
    (16, 32, 8, 132, 256, 128),    # an H200: 0.97 per SM
    (64, 32, 8, 132, 1024, 192),
    (8, 16, 1, 40, 128, 128),      # MQA on a T4: 16 query heads per KV head -> 2 blocks of 8
    (16, 16, 1, 40, 256, 128),     # 32 blocks = 0.8 per SM
])
def test_default_launch_splits_small_grids_over_the_sms(num_seqs, num_heads, num_kv_heads, num_sms, partition,
                                                         threads):
    # Without a tuned table: short partitions while a partition's blocks are under 0.75 per SM,
    # 256 tokens below 2 per SM, then 1024 (the H200 sweep in default_launch_config's docstring).
    assert default_launch_config(num_seqs, num_heads, num_kv_heads, num_sms) == {
        "partition_size": partition, "num_threads": threads}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_launch_without_a_tuned_table_is_the_default_for_this_gpu(monkeypatch, tmp_path):
    # 24 / 4 heads of 64 have no shipped table (and the user folder is empty): the launch is the
    # default rule's for this GPU's SM count, per batch size.
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    from vllm_volta.kernel_configs import clear_kernel_config_cache

    clear_kernel_config_cache()
    ours, _ = _layers(24, 4, 64)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for num_seqs in (1, 40, 400):
        for context in (640, 40960):
            assert ours.impl._launch_config(num_seqs, context, torch.float16, torch.device("cuda")) == \
                default_launch_config(num_seqs, 24, 4, sms, context)
    clear_kernel_config_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype,num_heads,num_kv_heads,head_size", [
    (torch.float16, 8, 2, 128), (torch.float16, 4, 4, 64), (torch.float16, 12, 2, 128),
    (torch.bfloat16, 8, 2, 128), (torch.float32, 8, 4, 96),
])
@pytest.mark.parametrize("prefill_kernel", ["chosen", "efficient"])
def test_matches_torch_sdpa(case, dtype, num_heads, num_kv_heads, head_size, prefill_kernel):
    """Both prefill kernels where the GPU has both: the one the platform chooses, and the
    memory-efficient one that SM70/75 always use."""
    if VoltaPagedBackend.validate(capability=DeviceCapability(*torch.cuda.get_device_capability()), dtype=dtype,
                                  head_size=head_size, device_type="cuda"):
        pytest.skip(f"VOLTA_PAGED cannot run {dtype} on this GPU (bf16 needs an SM80+ GPU and a build targeting it)")
    ours, ref = _layers(num_heads, num_kv_heads, head_size)
    if prefill_kernel == "efficient":
        ours.impl.prefill_kernel = "efficient"
    q, k, v, cache, md = _inputs(CASES[case], num_heads, num_kv_heads, head_size, dtype)
    ref_cache = cache.clone()
    out = ours(q, k, v, cache, md)
    expected = ref(q, k, v, ref_cache, md)
    assert torch.equal(cache, ref_cache), "reshape_and_cache must write exactly what the index write does"
    torch.testing.assert_close(out, expected, **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["prefill", "prefix-hit", "mixed"])
@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(12, 4), (12, 3)])
def test_efficient_prefill_in_kv_head_slices_matches_torch_sdpa(case, window, num_heads, num_kv_heads, monkeypatch):
    """A long context's memory-efficient prefill repeats its KV heads a slice at a time (here
    every context is past a 1-byte limit: one KV head per slice)."""
    from vllm_volta.attention.backends import volta_paged

    monkeypatch.setattr(volta_paged, "_PREFILL_REPEAT_BYTES", 1)
    ours, ref = _layers(num_heads, num_kv_heads, 128, sliding_window=window)
    ours.impl.prefill_kernel = "efficient"
    q, k, v, cache, md = _inputs(CASES[case], num_heads, num_kv_heads, 128, torch.float16)
    out = ours(q, k, v, cache.clone(), md)
    expected = ref(q, k, v, cache.clone(), md)
    torch.testing.assert_close(out, expected, **TOL[torch.float16])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("window,soft_cap", [(16, None), (7, None), (None, 3.0), (33, 2.0)])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", [(12, 2, 128), (8, 4, 256)])
@pytest.mark.parametrize("prefill_kernel", ["chosen", "efficient"])
def test_sliding_window_and_soft_cap_match_torch_sdpa(case, window, soft_cap, num_heads, num_kv_heads, head_size,
                                                       prefill_kernel):
    """Every kernel of the backend with a window and / or a cap, fp16, against TORCH_SDPA (checked
    against a float64 reference in test_torch_sdpa.py); the window / cap changes the output."""
    ours, ref = _layers(num_heads, num_kv_heads, head_size, sliding_window=window, logits_soft_cap=soft_cap)
    if prefill_kernel == "efficient":
        ours.impl.prefill_kernel = "efficient"
    q, k, v, cache, md = _inputs(CASES[case], num_heads, num_kv_heads, head_size, torch.float16, seed=1)
    q = q * 4  # scores large enough for the cap to matter
    out = ours(q, k, v, cache.clone(), md)
    expected = ref(q, k, v, cache.clone(), md)
    torch.testing.assert_close(out, expected, **TOL[torch.float16])
    if soft_cap is not None or max(c + n for c, n in CASES[case]) > window:
        plain = _layers(num_heads, num_kv_heads, head_size)[1](q, k, v, cache.clone(), md)
        assert (plain - expected).abs().max() > 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["prefill", "prefix-hit", "mixed"])
@pytest.mark.parametrize("prefill_kernel", ["chosen", "efficient"])
def test_forward_never_waits_for_the_device(case, prefill_kernel):
    """With async scheduling a step is launched while the one before runs on the GPU, so no op
    of the forward may synchronize with the device (torch's sync debug mode raises on one):
    the host would wait for all queued work, and the GPU then idle while the host launches.
    (Run on the H200 in both modes: repeat_interleave with a repeat count, which the
    memory-efficient path uses for grouped-query heads, does not synchronize in torch 2.11.)"""
    num_heads, num_kv_heads, head_size = 12, 2, 128
    ours, _ = _layers(num_heads, num_kv_heads, head_size)
    if prefill_kernel == "efficient":
        ours.impl.prefill_kernel = "efficient"
    ours(*_inputs(CASES[case], num_heads, num_kv_heads, head_size, torch.float16))  # kernel choice
    q, k, v, cache, md = _inputs(CASES[case], num_heads, num_kv_heads, head_size, torch.float16, seed=1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours(q, k, v, cache, md)  # a new metadata: its plan is built under the check too
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_replays_in_a_cuda_graph():
    """Capture one decode step with max_seq_len = max_model_len, then replay it for other
    lengths and blocks copied into the same buffers: output == eager TORCH_SDPA."""
    num_heads, num_kv_heads, head_size, dtype = 8, 2, 128, torch.float16
    max_model_len, num_blocks = 2048, 300  # one cache tensor for every round
    ours, ref = _layers(num_heads, num_kv_heads, head_size)
    rounds = [[(10, 1), (700, 1), (1500, 1)], [(30, 1), (2000, 1), (3, 1)], [(1000, 1), (0, 1), (511, 1)]]
    width = max_model_len // BLOCK_SIZE
    q, k, v, cache, md = _inputs(rounds[0], num_heads, num_kv_heads, head_size, dtype, num_blocks=num_blocks)
    # Static buffers the graph reads; the metadata's ints are the capture-time upper bounds.
    table = torch.zeros(len(rounds[0]), width, dtype=torch.int32, device="cuda")
    graph_md = build_attn_metadata([c for c, _ in rounds[0]], [1] * 3, [[0] * width] * 3, BLOCK_SIZE, "cuda")
    graph_md.block_table, graph_md.max_seq_len = table, max_model_len
    seq_lens, slots = graph_md.seq_lens, graph_md.slot_mapping

    def load(round_md):
        seq_lens.copy_(round_md.seq_lens)
        slots.copy_(round_md.slot_mapping)
        table.zero_()
        table[:, :round_md.block_table.shape[1]] = round_md.block_table

    load(md)
    ours(q, k, v, cache.clone(), graph_md)  # warm-up outside the graph (config lookup)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ours(q, k, v, cache, graph_md)

    for seed, seqs in enumerate(rounds[1:], start=1):
        q2, k2, v2, cache2, md2 = _inputs(seqs, num_heads, num_kv_heads, head_size, dtype, seed=seed,
                                          num_blocks=num_blocks)
        cache.copy_(cache2)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        load(md2)
        graph.replay()
        torch.testing.assert_close(out, ref(q2, k2, v2, cache2, md2), **TOL[dtype])
        assert torch.equal(cache, cache2)
