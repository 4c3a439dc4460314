"""Tiny random-weight HF checkpoints (and a tiny tokenizer) for engine tests.

Shared by test_v100/worker, test_v100/engine/test_llm_engine.py and
test_v100/entrypoints/test_llm.py. Weights use a larger init range than HF's default so
logits are peaked: greedy comparisons then do not hinge on near-ties.
"""
from __future__ import annotations

from pathlib import Path

import torch

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "mixtral", "qwen3_moe")
VOCAB_SIZE = 384


def tiny_config(arch: str, **overrides):
    import transformers
    common = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, initializer_range=0.15, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(sliding_window=None, **common)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=32, **common)
    elif arch == "gemma":  # as the real ones: GeGLU (tanh), tied embeddings
        cfg = transformers.GemmaConfig(head_dim=16, hidden_act="gelu_pytorch_tanh",
                                       **{**common, "tie_word_embeddings": True})
    elif arch == "gemma2":  # a sliding window shorter than the tests' longer prompts
        cfg = transformers.Gemma2Config(head_dim=16, sliding_window=16, query_pre_attn_scalar=16,
                                        **{**common, "tie_word_embeddings": True})
    elif arch == "gemma3":  # a sliding layer (rope_theta 10k) and a full one (1M, linear scaling)
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
        cfg = transformers.Gemma3TextConfig(head_dim=16, sliding_window=16, query_pre_attn_scalar=16,
                                            layer_types=["sliding_attention", "full_attention"],
                                            rope_parameters=rope, **{**common, "tie_word_embeddings": True})
    elif arch == "mixtral":  # top-2 of 4 experts
        cfg = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, sliding_window=None, **common)
    elif arch == "qwen3_moe":  # top-2 of 6 experts, not renormalized; layer 1 dense
        cfg = transformers.Qwen3MoeConfig(head_dim=32, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
                                          norm_topk_prob=False, mlp_only_layers=[1], **common)
    elif arch in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        # Hybrid: a Gated DeltaNet layer (recurrent state) and a gated full-attention layer.
        hybrid = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                      linear_value_head_dim=16, linear_conv_kernel_dim=4,
                      layer_types=["linear_attention", "full_attention"], **common)
        if arch == "qwen3_5":
            cfg = transformers.Qwen3_5TextConfig(**hybrid)
        else:
            moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                       shared_expert_intermediate_size=48)
            config_cls = transformers.Qwen3_5MoeTextConfig if arch == "qwen3_5_moe" else transformers.Qwen3NextConfig
            cfg = config_cls(**moe, **hybrid)
    else:
        raise ValueError(arch)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def build_tokenizer():
    """A byte-level BPE (trained in-test) with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    specials = ["<unk>", "<s>", "<|im_end|>", "<|im_start|>"]  # ids 0..3: eos is 2
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["The capital of France is Paris. Hello world, how are you today?",
              "vLLM serves large language models quickly on old and new GPUs.",
              "Numbers 0123456789 and punctuation!?;: are tokens too. café naïve"] * 20
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 16, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>",
                                   unk_token="<unk>", chat_template=template)


def save_tiny_model(path: Path, arch: str = "llama", *, seed: int = 0, with_tokenizer: bool = False,
                    **overrides):
    """Save a random tiny `arch` model (fp32) to `path`; returns the HF model (eval mode)."""
    import transformers
    torch.manual_seed(seed)
    cfg = tiny_config(arch, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()  # as hf_compare
    model.save_pretrained(path)
    if with_tokenizer:
        build_tokenizer().save_pretrained(path)
    return model


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy generate for exactly `max_new_tokens` (eos does not stop it,
    like ignore_eos=True; eos is not masked either)."""
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                              eos_token_id=None, bos_token_id=None, pad_token_id=0)
    # generate() falls back to the model's own eos when the config has none: clear it.
    saved, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), generation_config=config)
    finally:
        model.generation_config.eos_token_id = saved
    return out[0, len(prompt_ids):].tolist()


def random_prompts(num: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (num,), generator=g).tolist()
    # Ids from 4: 0..3 are special in build_tokenizer's vocabulary.
    return [torch.randint(4, VOCAB_SIZE, (n,), generator=g).tolist() for n in lens]


def tiny_model_dir(tmp_path_factory, arch: str = "llama", **kwargs) -> Path:
    """A fresh temp folder holding a saved tiny `arch` model (for module-scoped fixtures)."""
    path = tmp_path_factory.mktemp(f"tiny_{arch}")
    save_tiny_model(path, arch, **kwargs)
    return path


def tiny_models(tmp_path_factory, archs) -> dict:
    """arch -> (model dir, HF model) for each of ``archs`` (module-scoped fixtures), seeded by
    position."""
    models = {}
    for seed, arch in enumerate(archs):
        path = tmp_path_factory.mktemp(arch)
        models[arch] = (path, save_tiny_model(path, arch, seed=seed))
    return models

