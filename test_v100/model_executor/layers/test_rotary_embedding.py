"""RoPE vs transformers (default, linear, llama3), GPT-J style vs complex rotation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from vllm_volta.model_executor.layers.rotary_embedding import get_rope, rope_params_from_config

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_neox_matches_transformers(scaling):
    heads, kv_heads, d = 4, 2, 32
    config = LlamaConfig(hidden_size=heads * d, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=512,
                         rope_theta=50000.0, rope_scaling=SCALINGS[scaling])
    theta, rope_scaling = rope_params_from_config(config)
    assert theta == 50000.0
    rope = get_rope(d, d, config.max_position_embeddings, theta, True, rope_scaling)
    torch.manual_seed(0)
    positions = torch.tensor([0, 3, 17, 100, 511, 250])
    q, k = torch.randn(6, heads * d), torch.randn(6, kv_heads * d)
    q_out, k_out = rope(positions, q, k)

    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.view(1, 6, heads, d).transpose(1, 2),
                                        k.view(1, 6, kv_heads, d).transpose(1, 2), cos, sin)
    torch.testing.assert_close(q_out, q_ref.transpose(1, 2).reshape(6, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref.transpose(1, 2).reshape(6, -1), atol=1e-5, rtol=1e-5)


def test_gptj_style_is_complex_rotation():
    d, base = 8, 10000.0
    rope = get_rope(d, d, 64, base, is_neox_style=False)
    x = torch.randn(5, 2 * d)
    positions = torch.tensor([0, 1, 7, 30, 63])
    out, _ = rope(positions, x, None)
    inv_freq = base ** (-torch.arange(0, d, 2).double() / d)
    angle = positions.double()[:, None, None] * inv_freq  # [T, 1, d/2]
    pairs = torch.view_as_complex(x.double().view(5, 2, d // 2, 2).contiguous())
    ref = torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).reshape(5, -1)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_partial_rotary_dim_keeps_the_rest():
    full = get_rope(8, 8, 32, 10000.0)
    partial = get_rope(16, 8, 32, 10000.0)
    x = torch.randn(3, 2 * 16)
    positions = torch.tensor([1, 5, 9])
    out, _ = partial(positions, x, None)
    heads_in, heads_out = x.view(3, 2, 16), out.view(3, 2, 16)
    assert torch.equal(heads_out[..., 8:], heads_in[..., 8:])
    ref, _ = full(positions, heads_in[..., :8].reshape(3, 16))
    torch.testing.assert_close(heads_out[..., :8].reshape(3, 16), ref)


def test_fp16_input_keeps_dtype():
    rope = get_rope(16, 16, 32, 10000.0)
    q = torch.randn(2, 32).half()
    out, k = rope(torch.tensor([3, 4]), q, q)
    assert out.dtype == torch.float16 and k.dtype == torch.float16
    ref, _ = rope(torch.tensor([3, 4]), q.float(), None)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)


def test_config_styles_and_errors():
    v4 = SimpleNamespace(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0})
    assert rope_params_from_config(v4) == (1e6, {"type": "linear", "factor": 2.0})
    assert rope_params_from_config(SimpleNamespace()) == (10000.0, None)
    v5_default = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 5.0})
    assert rope_params_from_config(v5_default) == (5.0, None)
    assert rope_params_from_config(v5_default, "sliding_attention") == (5.0, None)
    # Gemma 3: parameters per layer type (transformers 5), or a local base beside the global ones.
    linear = {"rope_type": "linear", "factor": 8.0}
    v5_typed = SimpleNamespace(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                "full_attention": {**linear, "rope_theta": 1e6}})
    assert rope_params_from_config(v5_typed, "sliding_attention") == (1e4, None)
    assert rope_params_from_config(v5_typed, "full_attention") == (1e6, linear)
    v4_local = SimpleNamespace(rope_theta=1e6, rope_scaling=linear, rope_local_base_freq=1e4)
    assert rope_params_from_config(v4_local, "sliding_attention") == (1e4, None)
    assert rope_params_from_config(v4_local, "full_attention") == (1e6, linear)
    assert get_rope(8, 8, 16, 1e4, True, {"type": "linear", "factor": 2.0}).cos_sin_cache.shape \
        == (32, 8)
    with pytest.raises(ValueError, match="not supported; supported: default, linear, llama3, yarn"):
        get_rope(8, 8, 16, 1e4, True, {"rope_type": "su"})
    with pytest.raises(ValueError, match="rotary_dim"):
        get_rope(8, 10, 16, 1e4)


def test_cpu_forward_is_forward_native(monkeypatch):
    """On CPU the fused op is never called: forward is the plain-PyTorch path (inputs untouched)."""
    from vllm_volta.model_executor.layers import rotary_embedding as rope_module

    def fail(*args, **kwargs):
        raise AssertionError("the CUDA op must not run on CPU")

    monkeypatch.setattr(rope_module.ops, "rotary_embedding", fail)
    rope = get_rope(32, 32, 64, 10000.0, True)
    qkv = torch.randn(5, (4 + 2 * 2) * 32)
    q, k, _ = qkv.split([128, 64, 64], dim=-1)
    before = qkv.clone()
    positions = torch.tensor([0, 1, 9, 33, 63])
    q_out, k_out = rope(positions, q, k)
    q_ref, k_ref = rope.forward_native(positions, q, k)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    assert torch.equal(qkv, before)


def _bf16_ok() -> bool:
    from vllm_volta import _custom_ops as ops
    return torch.cuda.get_device_capability() >= (8, 0) and ops.cuda_bf16_kernels_built()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_cuda_forward_rotates_qkv_views_in_place(dtype, scaling, is_neox):
    """The model's call pattern: q/k are column views of the fused qkv output; forward rotates
    them in place with the fused op, exactly as forward_native would."""
    if dtype == torch.bfloat16 and not _bf16_ok():
        pytest.skip("bfloat16 needs a GPU of compute capability >= 8.0 and a build targeting it")
    heads, kv_heads, d, num_tokens = 8, 2, 128, 19
    rope = get_rope(d, d, 512, 500000.0, is_neox, SCALINGS[scaling]).cuda()
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * d, device="cuda").to(dtype)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    v_before = v.clone()
    positions = torch.randint(0, 512, (num_tokens,), device="cuda")
    q_ref, k_ref = rope.forward_native(positions, q.clone(), k.clone())
    q_out, k_out = rope(positions, q, k)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()  # in place
    assert q_out.shape == q_ref.shape and k_out.shape == k_ref.shape
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    assert torch.equal(v, v_before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_forward_3d_input_and_no_key_keep_todays_shapes():
    rope = get_rope(64, 32, 128, 10000.0, True).cuda()
    q = torch.randn(6, 4, 64, device="cuda", dtype=torch.float16)
    positions = torch.arange(6, device="cuda")
    q_ref, _ = rope.forward_native(positions, q.clone(), None)
    q_out, k_out = rope(positions, q, None)
    assert k_out is None and q_out.shape == (6, 256)
    assert torch.equal(q_out, q_ref)


def test_empty_batch_keeps_shapes():
    """0 tokens (an empty step) is not an error: reshape(0, -1, D) would be ambiguous."""
    rope = get_rope(64, 32, 128, 10000.0, True)
    q, k = torch.empty(0, 4 * 64), torch.empty(0, 2, 64)
    q_out, k_out = rope.forward_native(torch.empty(0, dtype=torch.int64), q, k)
    assert q_out.shape == (0, 4 * 64) and k_out.shape == (0, 2 * 64)
