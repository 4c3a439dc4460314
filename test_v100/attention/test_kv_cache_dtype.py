"""FP8 KV cache on CPU: the kv_cache_dtype values and their errors, the quantizing cache write
(rounding and saturation), TORCH_SDPA over an FP8 cache against a float64 reference of the
dequantized cache, and checkpoint k / v scales reaching the layers."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.attention.backends.torch_sdpa import TorchSDPAImpl
from vllm_volta.attention.kv_cache_dtype import (KV_CACHE_DTYPES, kv_cache_torch_dtype, kv_scale_target, scale_value)
from vllm_volta.attention.layer import Attention, write_to_kv_cache
from vllm_volta.attention.metadata import build_attn_metadata
from vllm_volta.config import CacheConfig
from vllm_volta.engine.arg_utils import EngineArgs

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("bad", ["fp16", "int8", "FP8", "", None])
def test_bad_kv_cache_dtype_names_the_field_and_the_values(bad):
    allowed = "kv_cache_dtype must be one of auto, fp8, fp8_e4m3, fp8_e5m2"
    with pytest.raises(ValueError, match=allowed):
        CacheConfig(kv_cache_dtype=bad)
    with pytest.raises(ValueError, match=allowed):  # before any model is looked at
        EngineArgs(model="/nonexistent", kv_cache_dtype=bad).create_engine_config()


def test_values_map_to_vllms_formats_and_the_server_flag_parses():
    from vllm_volta.entrypoints.cli import parse_args
    from vllm_volta.entrypoints.openai.cli_args import build_engine_args, check_vllm_flags

    assert KV_CACHE_DTYPES == ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    assert kv_cache_torch_dtype("auto", torch.float16) is torch.float16
    assert kv_cache_torch_dtype("fp8", torch.float16) is torch.float8_e4m3fn  # vLLM's fp8 on CUDA
    assert kv_cache_torch_dtype("fp8_e4m3", torch.bfloat16) is torch.float8_e4m3fn
    assert kv_cache_torch_dtype("fp8_e5m2", torch.float32) is torch.float8_e5m2
    args = parse_args(["serve", "m", "--kv-cache-dtype", "fp8_e5m2"])
    check_vllm_flags(args)  # an engine flag now, not a refused vLLM-only one
    assert build_engine_args(args).kv_cache_dtype == "fp8_e5m2"
    assert build_engine_args(parse_args(["serve", "m"])).kv_cache_dtype == "auto"


# (value before scaling, scale, expected after the write): ties to even, subnormals, saturation.
E4M3_CASES = [(1.0625, 1.0, 1.0), (1.1875, 1.0, 1.25), (2.125, 2.0, 1.0), (1000.0, 1.0, 448.0),
              (-1e30, 1.0, -448.0), (float("inf"), 1.0, 448.0), (2.0 ** -10, 1.0, 0.0),
              (3 * 2.0 ** -10, 1.0, 2.0 ** -8), (0.9 * 2.0 ** -6, 1.0, 2.0 ** -6 - 2.0 ** -9), (-3.0, 0.5, -6.0)]
E5M2_CASES = [(1.125, 1.0, 1.0), (1.375, 1.0, 1.5), (60000.0, 1.0, 57344.0), (-1e9, 4.0, -57344.0),
              (2.0 ** -17, 1.0, 0.0), (3 * 2.0 ** -17, 1.0, 2.0 ** -15), (10.0, 0.25, 40.0)]


@pytest.mark.parametrize("dtype,cases", [(torch.float8_e4m3fn, E4M3_CASES), (torch.float8_e5m2, E5M2_CASES)])
def test_cache_write_rounds_to_nearest_even_and_saturates(dtype, cases):
    """The CPU write stores x / scale as the nearest FP8 value (ties to the even mantissa),
    saturated to the largest finite one; expected values worked out by hand."""
    n = len(cases)
    key = torch.tensor([c[0] for c in cases]).view(n, 1, 1).expand(n, 1, 16).contiguous()
    cache = torch.zeros(2, 2, n, 1, 16, dtype=dtype)
    for i, (_, scale, expected) in enumerate(cases):
        write_to_kv_cache(key[i:i + 1], key[i:i + 1], cache, torch.tensor([i]), k_scale=scale, v_scale=scale)
        assert cache[0, 0, i].float().unique().tolist() == [expected], cases[i]
        assert cache[1, 0, i].float().unique().tolist() == [expected], cases[i]


@pytest.mark.parametrize("dtype", FP8)
def test_cache_write_is_torchs_conversion_of_the_scaled_values(dtype):
    torch.manual_seed(0)
    key, value = torch.randn(7, 2, 16) * 300, torch.randn(7, 2, 16)
    cache = torch.zeros(2, 3, 4, 2, 16, dtype=dtype)
    slots = torch.tensor([0, 5, 11, -1, 2, 3, 9])
    write_to_kv_cache(key, value, cache, slots, k_scale=0.75, v_scale=0.01)
    limit = torch.finfo(dtype).max
    valid = slots >= 0
    got_k = cache[0].view(-1, 2, 16)[slots[valid]].view(torch.uint8)
    got_v = cache[1].view(-1, 2, 16)[slots[valid]].view(torch.uint8)
    assert torch.equal(got_k, (key[valid] / 0.75).clamp(-limit, limit).to(dtype).view(torch.uint8))
    assert torch.equal(got_v, (value[valid] / 0.01).clamp(-limit, limit).to(dtype).view(torch.uint8))


def _reference(q, cache, scales, seq, blocks, block_size, num_new, kv_heads):
    """float64 attention of sequence `seq`'s new tokens over its dequantized cached context."""
    length = seq
    slots = torch.tensor([blocks[i // block_size] * block_size + i % block_size for i in range(length)])
    k = cache[0].view(-1, kv_heads, cache.shape[-1])[slots].double() * scales[0]
    v = cache[1].view(-1, kv_heads, cache.shape[-1])[slots].double() * scales[1]
    heads = q.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * q.shape[-1] ** -0.5
    pos_q = torch.arange(length - num_new, length)[:, None]
    scores = scores.masked_fill(torch.arange(length)[None, :] > pos_q, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("dtype", FP8)
def test_torch_sdpa_reads_the_fp8_cache_dequantized(dtype):
    """A decode and a chunked prefill over an FP8 cache (the keys / values of the step written by
    the layer's quantizing write) against float64 attention over the dequantized cache."""
    torch.manual_seed(1)
    heads, kv_heads, d, block_size = 4, 2, 16, 4
    impl = TorchSDPAImpl(heads, d, d ** -0.5, kv_heads)
    impl.k_scale, impl.v_scale = 0.5, 2.0
    cache = torch.zeros(2, 8, block_size, kv_heads, d, dtype=dtype)
    # Sequence 0: 6 tokens cached + 1 decoded; sequence 1: 3 cached + a chunk of 4.
    seqs, blocks = [(6, 1), (3, 4)], [[3, 1], [5, 0]]
    cached = torch.randn(9, kv_heads * d) * 3
    write_to_kv_cache(cached, -cached, cache, torch.tensor([12, 13, 14, 15, 4, 5, 20, 21, 22]), 0.5, 2.0)
    md = build_attn_metadata([c for c, _ in seqs], [n for _, n in seqs], blocks, block_size)
    new_k, new_v = torch.randn(5, kv_heads * d) * 3, torch.randn(5, kv_heads * d)
    write_to_kv_cache(new_k, new_v, cache, md.slot_mapping, impl.k_scale, impl.v_scale)
    q = torch.randn(5, heads * d)
    out = impl.forward(q, new_k, new_v, cache, md).view(5, heads, d)
    start = 0
    for (computed, new), table in zip(seqs, blocks):
        ref = _reference(q[start:start + new].view(new, heads, d), cache, (0.5, 2.0), computed + new, table,
                         block_size, new, kv_heads)
        torch.testing.assert_close(out[start:start + new].double(), ref, atol=1e-5, rtol=1e-5)
        start += new


@pytest.mark.parametrize("name,target", [
    ("model.layers.3.self_attn.k_scale", ("model.layers.3.self_attn", ("k",))),
    ("model.layers.3.self_attn.attn.v_scale", ("model.layers.3.self_attn", ("v",))),
    ("model.layers.0.self_attn.kv_scale", ("model.layers.0.self_attn", ("k", "v"))),
    ("model.layers.1.self_attn.k_proj.output_scale", ("model.layers.1.self_attn", ("k",))),
    ("model.layers.1.self_attn.k_proj.weight_scale", None),
    ("model.layers.1.mlp.k_scale", None),
])
def test_checkpoint_scale_names(name, target):
    assert kv_scale_target(name) == target


def test_scale_values_must_be_one_positive_number():
    assert scale_value("s", torch.tensor(0.25)) == 0.25
    assert scale_value("s", torch.tensor([0.5, 0.5])) == 0.5  # one per shard, all equal
    for bad in (torch.tensor([0.5, 0.25]), torch.tensor(0.0), torch.tensor(float("inf")), torch.tensor([])):
        with pytest.raises(ValueError, match="checkpoint weight 's'"):
            scale_value("s", bad)


def test_scales_reach_the_layers_impls():
    from torch import nn

    from vllm_volta.attention.kv_cache_dtype import describe_kv_scales, load_kv_scale

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = nn.Module()
            self.self_attn.attn = Attention(2, 16, 0.25, 2)

    model = nn.Module()
    model.layers = nn.ModuleList([Block(), Block()])
    assert describe_kv_scales(model, "auto") is None
    assert "k/v scales 1.0" in describe_kv_scales(model, "fp8")
    assert load_kv_scale(model, "layers.1.self_attn.k_scale", torch.tensor(0.5))
    assert load_kv_scale(model, "layers.1.self_attn.attn.v_scale", torch.tensor([2.0]))
    assert not load_kv_scale(model, "layers.1.self_attn.q_proj.weight", torch.zeros(1))
    impl = model.layers[1].self_attn.attn.impl
    assert (impl.k_scale, impl.v_scale) == (0.5, 2.0)
    assert (model.layers[0].self_attn.attn.impl.k_scale, model.layers[0].self_attn.attn.impl.v_scale) == (1.0, 1.0)
    assert describe_kv_scales(model, "fp8_e5m2") == (
        "KV cache dtype fp8_e5m2 (float8_e5m2, 1 byte per element): k/v scales from the checkpoint for 1 of 2 "
        "attention layers (1.0 for the others)")
    with pytest.raises(ValueError, match="no Attention layer at 'layers.5.self_attn'"):
        load_kv_scale(model, "layers.5.self_attn.k_scale", torch.tensor(1.0))


def test_volta_paged_refuses_fp8_caches_of_float32_models():
    from vllm_volta.attention.backends.volta_paged import VoltaPagedBackend
    from vllm_volta.attention.kv_cache_dtype import check_backend_supports

    check_backend_supports(VoltaPagedBackend, torch.float16, "fp8")
    check_backend_supports(VoltaPagedBackend, torch.float32, "auto")
    check_backend_supports(TorchSDPAImpl, torch.float32, "fp8")  # any backend without the limit
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8_e5m2' with the VOLTA_PAGED attention backend needs "
                                         "dtype float16 or bfloat16, got float32"):
        check_backend_supports(VoltaPagedBackend, torch.float32, "fp8_e5m2")
