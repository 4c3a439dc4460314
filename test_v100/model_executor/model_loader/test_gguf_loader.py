"""iterate_gguf_weights: name mapping, the q/k un-permutation, and the real default model
(weights vs transformers' GGUF loader; a plain-PyTorch forward must answer " Paris")."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config
from vllm_volta.model_executor.model_loader.gguf_loader import (
    gguf_to_hf_name,
    iterate_gguf_weights,
    unpermute_qk,
)
from vllm_volta.transformers_utils.gguf_tokenizer import load_gguf_tokenizer


@pytest.mark.parametrize(
    "gguf_name,hf_name",
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"),
        ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
        ("blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"),
        ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
        ("blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"),
        ("blk.7.ffn_gate.weight", "model.layers.7.mlp.gate_proj.weight"),
        ("blk.7.ffn_up.weight", "model.layers.7.mlp.up_proj.weight"),
        ("blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight"),
    ],
)
def test_gguf_to_hf_name(gguf_name: str, hf_name: str):
    assert gguf_to_hf_name(gguf_name) == hf_name


def test_unknown_name_raises():
    with pytest.raises(ValueError, match="blk.0.ffn_gate_inp.weight"):
        gguf_to_hf_name("blk.0.ffn_gate_inp.weight")


def _interleaved_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's (non-NeoX) rope: rotate adjacent pairs (2i, 2i+1) by pos * theta^(-2i/d)."""
    d = x.shape[-1]
    angle = pos[:, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def _llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf's reordering of q/k rows: per head [2, d/2] -> [d/2, 2]."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(
        w.shape
    )


@pytest.mark.parametrize("n_q,n_kv", [(4, 4), (6, 2)])
def test_unpermute_reproduces_llama_cpp_attention(n_q: int, n_kv: int):
    torch.manual_seed(0)
    d, hidden, seq, theta = 8, 20, 7, 10000.0
    wq_hf = torch.randn(n_q * d, hidden, dtype=torch.float64)
    wk_hf = torch.randn(n_kv * d, hidden, dtype=torch.float64)
    bias_hf = torch.randn(n_q * d, dtype=torch.float64)
    wq_gguf, wk_gguf = _llama_cpp_permute(wq_hf, n_q), _llama_cpp_permute(wk_hf, n_kv)
    # Exact inverse, for weights and biases.
    assert torch.equal(unpermute_qk(wq_gguf, n_q), wq_hf)
    assert torch.equal(unpermute_qk(wk_gguf, n_kv), wk_hf)
    assert torch.equal(unpermute_qk(_llama_cpp_permute(bias_hf, n_q), n_q), bias_hf)

    # What llama.cpp computes (GGUF rows, adjacent-pair rope) equals what HF computes
    # (un-permuted rows, rotate_half rope): identical attention scores.
    x = torch.randn(seq, hidden, dtype=torch.float64)
    pos = torch.arange(seq)
    q_cpp = _interleaved_rope((x @ wq_gguf.T).view(seq, n_q, d), pos, theta)
    k_cpp = _interleaved_rope((x @ wk_gguf.T).view(seq, n_kv, d), pos, theta)
    inv = theta ** (-torch.arange(0, d, 2).double() / d)
    freqs = torch.cat([pos[:, None] * inv, pos[:, None] * inv], dim=-1)
    q_hf = (x @ unpermute_qk(wq_gguf, n_q).T).view(seq, n_q, d).transpose(0, 1)
    k_hf = (x @ unpermute_qk(wk_gguf, n_kv).T).view(seq, n_kv, d).transpose(0, 1)
    q_hf, k_hf = apply_rotary_pos_emb(q_hf[None], k_hf[None], freqs.cos()[None], freqs.sin()[None])
    rep = n_q // n_kv
    scores_cpp = torch.einsum("qhd,khd->hqk", q_cpp, k_cpp.repeat_interleave(rep, dim=1))
    scores_hf = torch.einsum("hqd,hkd->hqk", q_hf[0], k_hf[0].repeat_interleave(rep, dim=0))
    torch.testing.assert_close(scores_hf, scores_cpp)
    # ...while skipping the un-permutation would not.
    q_wrong = (x @ wq_gguf.T).view(seq, n_q, d).transpose(0, 1)
    q_wrong, _ = apply_rotary_pos_emb(q_wrong[None], k_hf, freqs.cos()[None], freqs.sin()[None])
    wrong = torch.einsum("hqd,hkd->hqk", q_wrong[0], k_hf[0].repeat_interleave(rep, dim=0))
    assert not torch.allclose(wrong, scores_cpp)


def test_unpermute_rejects_bad_head_count():
    with pytest.raises(ValueError, match="cannot hold 4 heads"):
        unpermute_qk(torch.zeros(12, 3), 4)


# ----- the real default model (SmolLM2-135M-Instruct, Q4_1 + Q8_0 + F32 tensors) -----


@pytest.fixture(scope="module")
def smol(default_model_path):
    config = load_gguf_config(default_model_path)
    weights = dict(iterate_gguf_weights(default_model_path, use_tqdm=False))
    return config, weights


def test_default_model_weights_match_transformers(default_model_path, smol):
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    config, weights = smol
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    ref = gguf_utils.load_gguf_checkpoint(
        str(default_model_path), return_tensors=True, model_to_load=skeleton
    )["tensors"]
    assert set(weights) == set(ref)
    assert "lm_head.weight" not in weights  # tied
    for name, tensor in ref.items():
        assert weights[name].shape == tensor.shape, name
        torch.testing.assert_close(weights[name].float(), tensor.float(), rtol=0, atol=0)


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    return float(theta if theta is not None else config.rope_parameters["rope_theta"])


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference_llama_logits(config, w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """A from-scratch fp32 Llama forward over one sequence; returns [T, vocab] logits."""
    n_q, n_kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    eps, seq = config.rms_norm_eps, len(ids)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)].float()
    inv = _rope_theta(config) ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(seq, dtype=torch.float32)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rope(t: torch.Tensor) -> torch.Tensor:
        return t * cos + torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1) * sin

    mask = torch.ones(seq, seq, dtype=torch.bool).tril()
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(seq, n_q, d))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(seq, n_kv, d))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(seq, n_kv, d)
        k, v = k.repeat_interleave(n_q // n_kv, 1), v.repeat_interleave(n_q // n_kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(seq, n_q * d)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate_up = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + gate_up @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


@pytest.fixture(scope="module")
def smol_hf(smol) -> LlamaForCausalLM:
    """transformers' Llama holding the loaded weights (fp32)."""
    config, weights = smol
    model = LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model


def test_default_model_predicts_paris(default_model_path, smol, smol_hf):
    config, weights = smol
    tokenizer = load_gguf_tokenizer(default_model_path)
    ids = tokenizer("The capital of France is").input_ids
    with torch.no_grad():
        logits = reference_llama_logits(config, weights, ids)
        hf_logits = smol_hf(torch.tensor([ids])).logits[0]
    # The from-scratch reference agrees with transformers' Llama on the same weights.
    torch.testing.assert_close(logits, hf_logits, rtol=1e-3, atol=1e-3)
    assert tokenizer.decode([int(logits[-1].argmax())]) == " Paris"


def test_default_model_chat_answer_in_fp32(default_model_path, smol_hf):
    tokenizer = load_gguf_tokenizer(default_model_path)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = smol_hf.generate(
            torch.tensor([ids]), max_new_tokens=10, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )[0, len(ids):]  # fmt: skip
    assert tokenizer.decode(out, skip_special_tokens=True).startswith(
        "The capital of France is Paris"
    )
