"""GGUF config + weights on tiny files written the way llama.cpp's converter writes them.

A random-weight transformers model is saved as GGUF (llama.cpp names and metadata keys, q/k
rows permuted for llama), read back with load_gguf_config / iterate_gguf_weights into a fresh
transformers model, and must give the original logits.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config
from vllm_volta.model_executor.model_loader.gguf_loader import iterate_gguf_weights

_TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
             max_position_embeddings=256, bos_token_id=1, eos_token_id=2)  # fmt: skip
_CONFIGS = {
    "llama": lambda: LlamaConfig(**_TINY, rope_theta=50000.0, tie_word_embeddings=False),
    "qwen2": lambda: Qwen2Config(**_TINY, rope_theta=1e6, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**_TINY, head_dim=32, rope_theta=1e6, tie_word_embeddings=True),
}
# HF suffix of each per-layer tensor -> llama.cpp's name for it.
_LAYER_TENSORS = [
    ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
]  # fmt: skip


def _theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    return float(theta if theta is not None else cfg.rope_parameters["rope_theta"])


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k reordering: each head's rows [2, d/2] -> [d/2, 2]."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape
    )


def _gguf_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        _, _, layer, rest = hf_name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{dict(_LAYER_TENSORS)[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
            "output_norm.weight", "lm_head.weight": "output.weight"}[hf_name]  # fmt: skip


def write_gguf(path: Path, arch: str, cfg, state: dict[str, torch.Tensor], extra=None) -> Path:
    """Write ``state`` (HF names) as a float32 GGUF file of architecture ``arch``."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(_theta(cfg))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    for fn in extra or ():
        fn(w)
    for name, tensor in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if arch == "llama" and ".q_proj." in name:
            data = _llama_cpp_permute(data, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            data = _llama_cpp_permute(data, cfg.num_key_value_heads)
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", list(_CONFIGS))
def test_round_trip_gives_original_logits(arch: str, tmp_path: Path):
    torch.manual_seed(0)
    cfg = _CONFIGS[arch]()
    original = AutoModelForCausalLM.from_config(cfg).eval()
    if arch == "qwen2":  # Qwen2 has q/k/v biases: make them non-zero so they are checked
        with torch.no_grad():
            for name, p in original.named_parameters():
                if name.endswith("bias"):
                    p.normal_()
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, cfg, original.state_dict())

    loaded_cfg = load_gguf_config(path)
    assert loaded_cfg.model_type == arch
    assert loaded_cfg.architectures == [type(original).__name__]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                "eos_token_id"):  # fmt: skip
        assert getattr(loaded_cfg, key) == getattr(cfg, key), key
    assert _theta(loaded_cfg) == _theta(cfg)
    if arch == "qwen3":
        assert loaded_cfg.head_dim == 32

    weights = dict(iterate_gguf_weights(path, use_tqdm=False))
    expected_names = set(original.state_dict()) - (
        {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    )
    assert set(weights) == expected_names
    rebuilt = AutoModelForCausalLM.from_config(loaded_cfg).eval()
    missing, unexpected = rebuilt.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ids = torch.randint(0, cfg.vocab_size, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, original(ids).logits, rtol=0, atol=1e-5)


def _llama3_rope_freqs(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """What llama.cpp stores as rope_freqs: HF's default / llama3 inverse frequencies."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(**{**_TINY, "max_position_embeddings": 131072}, head_dim=head_dim,
                      rope_theta=theta, rope_scaling=scaling)  # fmt: skip
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    default = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (default / scaled.double()).float().numpy()


@pytest.mark.parametrize("factor,orig", [(8.0, 8192), (32.0, 8192)])
def test_llama3_rope_scaling_from_rope_freqs(tmp_path: Path, factor: float, orig: int):
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": orig}  # fmt: skip
    cfg = LlamaConfig(**_TINY, rope_theta=500000.0)
    freqs = _llama3_rope_freqs(500000.0, 16, scaling)
    assert freqs.max() == pytest.approx(factor) and freqs.min() == pytest.approx(1.0)
    state = AutoModelForCausalLM.from_config(cfg).state_dict()
    add = [lambda w: w.add_tensor("rope_freqs.weight", freqs)]
    path = write_gguf(tmp_path / "l3.gguf", "llama", cfg, state, extra=add)
    got = load_gguf_config(path).rope_scaling
    assert {k: got[k] for k in scaling} == scaling
    # rope_freqs is config, not a parameter.
    assert "rope_freqs.weight" not in {n for n, _ in iterate_gguf_weights(path, use_tqdm=False)}


def test_linear_and_yarn_rope_scaling_metadata(tmp_path: Path):
    cfg = LlamaConfig(**_TINY, rope_theta=10000.0)
    state = AutoModelForCausalLM.from_config(cfg).state_dict()
    linear = [lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
              lambda w: w.add_rope_scaling_factor(4.0)]  # fmt: skip
    got = load_gguf_config(write_gguf(tmp_path / "lin.gguf", "llama", cfg, state, linear))
    assert got.rope_scaling["rope_type"] == "linear" and got.rope_scaling["factor"] == 4.0
    yarn = [lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN),
            lambda w: w.add_rope_scaling_factor(4.0),
            lambda w: w.add_rope_scaling_orig_ctx_len(64)]  # fmt: skip
    got = load_gguf_config(write_gguf(tmp_path / "yarn.gguf", "qwen2", cfg, state, yarn))
    assert got.rope_scaling["rope_type"] == "yarn"
    assert got.rope_scaling["original_max_position_embeddings"] == 64
    none = load_gguf_config(write_gguf(tmp_path / "plain.gguf", "llama", cfg, state))
    assert none.rope_scaling in (None, {"rope_type": "default", "rope_theta": 10000.0})


def test_unsupported_architecture_lists_supported(tmp_path: Path):
    cfg = LlamaConfig(**_TINY)
    path = write_gguf(tmp_path / "x.gguf", "gpt2", cfg, {})
    with pytest.raises(ValueError, match=r"'gpt2'.*llama, qwen2, qwen3"):
        load_gguf_config(path)


def test_unknown_tensor_and_type_are_named(tmp_path: Path):
    cfg = LlamaConfig(**_TINY)
    state = AutoModelForCausalLM.from_config(cfg).state_dict()
    moe = [lambda w: w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((2, 4), np.float32))]
    path = write_gguf(tmp_path / "moe.gguf", "llama", cfg, state, moe)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_gate_exps\.weight"):
        list(iterate_gguf_weights(path, use_tqdm=False))
    iq = gguf.GGMLQuantizationType.IQ4_NL
    raw = np.zeros((4, 2 * gguf.GGML_QUANT_SIZES[iq][1]), np.uint8)
    odd = {k: v for k, v in state.items() if k != "model.norm.weight"}
    add = [lambda w: w.add_tensor("output_norm.weight", raw, raw_dtype=iq)]
    path = write_gguf(tmp_path / "iq.gguf", "llama", cfg, odd, add)
    with pytest.raises(ValueError, match=r"output_norm\.weight.*IQ4_NL"):
        list(iterate_gguf_weights(path, use_tqdm=False))


def test_missing_file_is_value_error(tmp_path: Path):
    with pytest.raises(ValueError, match="does not exist"):
        load_gguf_config(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        load_gguf_config(bad)


def test_head_dim_default_is_hidden_over_heads(tmp_path: Path):
    cfg = LlamaConfig(**_TINY)
    got = load_gguf_config(write_gguf(tmp_path / "h.gguf", "llama", cfg, {}))
    assert got.head_dim == 64 // 4
    assert math.isclose(got.rms_norm_eps, 1e-5)


def test_quantization_flag_accepts_gguf(tmp_path: Path):
    """vLLM's --quantization gguf goes with a GGUF file; another method with it is an error."""
    from vllm_volta.config import ModelConfig

    torch.manual_seed(0)
    cfg = _CONFIGS["llama"]()
    path = write_gguf(tmp_path / "q.gguf", "llama", cfg, AutoModelForCausalLM.from_config(cfg).state_dict())
    ModelConfig(model=str(path), quantization="gguf", skip_tokenizer_init=True, dtype="float32")
    with pytest.raises(ValueError, match="quantization='awq', but the checkpoint is gguf-quantized"):
        ModelConfig(model=str(path), quantization="awq", skip_tokenizer_init=True, dtype="float32")
