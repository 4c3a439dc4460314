"""Qwen3.5 (Gated DeltaNet + gated attention; dense and MoE; text-only and image-text
checkpoints) vs transformers, through the paged KV cache and the recurrent-state slots."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from vllm_volta.core.kv_cache_spec import FullAttentionSpec, MambaSpec
from vllm_volta.model_executor.layers.rotary_embedding import get_rope

from . import hf_compare
from .hf_compare import TINY, check_fp16_engine_logprobs, check_needed, check_single_prefill, hf_and_ours, load_ours

# Two DeltaNet layers (value heads read key heads in pairs) around a full-attention one whose
# RoPE covers a quarter of each head (the default partial_rotary_factor).
TEXT = dict(TINY, num_hidden_layers=3, head_dim=32, max_position_embeddings=256, linear_conv_kernel_dim=4,
            linear_key_head_dim=16, linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=["linear_attention", "full_attention", "linear_attention"])
MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=40)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TINY["hidden_size"])


def save_image_text_model(config: transformers.PretrainedConfig, folder: Path,
                          stack_experts: bool = False) -> transformers.PreTrainedModel:
    """A random Qwen3.5 image-text model saved as the hub's checkpoints are (language model under
    ``model.language_model.``), plus a multi-token-prediction tensor; ``stack_experts``: each
    layer's experts rewritten as stacked ``experts.gate_up_proj`` / ``experts.down_proj``."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForImageTextToText.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0.0, 0.15)
    hf.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["mtp.fc.weight"] = torch.zeros(4, 4)
    if stack_experts:
        prefix = "model.language_model.layers.{}.mlp.experts"
        for layer in range(config.text_config.num_hidden_layers):
            p = prefix.format(layer)
            experts = range(config.text_config.num_experts)
            gate_up = [torch.cat([tensors.pop(f"{p}.{e}.gate_proj.weight"), tensors.pop(f"{p}.{e}.up_proj.weight")])
                       for e in experts]
            tensors[f"{p}.gate_up_proj"] = torch.stack(gate_up)
            tensors[f"{p}.down_proj"] = torch.stack([tensors.pop(f"{p}.{e}.down_proj.weight") for e in experts])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return hf


def _image_text(moe: bool, stack_experts: bool = False):
    def build(folder: Path):
        cls = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
        config = cls(text_config=dict(TEXT, **(MOE if moe else {})), vision_config=VISION)
        config.architectures = ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"]
        return save_image_text_model(config, folder, stack_experts), load_ours(folder)
    return build


CHECKPOINTS = {
    "dense": lambda folder: hf_and_ours(transformers.Qwen3_5TextConfig(**TEXT), folder),
    "moe": lambda folder: hf_and_ours(transformers.Qwen3_5MoeTextConfig(**TEXT, **MOE), folder),
    "image_text": _image_text(moe=False),
    "moe_image_text_stacked_experts": _image_text(moe=True, stack_experts=True),
}

# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def models(request, tmp_path_factory):
    return CHECKPOINTS[request.param](tmp_path_factory.mktemp(request.param))


def test_long_prefill_crosses_delta_rule_chunks(models):
    """150 tokens in one step: the chunked delta rule's chunks of 64 hand their state on."""
    check_single_prefill(models[1], models[0], length=150)


def test_loaded_as_hybrid(models):
    hf, ours = models
    assert type(ours).__name__ == hf.config.architectures[0]
    assert not any("visual" in name or "mtp" in name for name, _ in ours.named_parameters())
    specs = ours.kv_cache_specs()
    state = MambaSpec(shapes=((2 * 32 + 96, 3), (4, 16, 24)), dtypes=(torch.float32, torch.float32))
    assert specs == [state, FullAttentionSpec(2, 32, torch.float32), state]
    hf_attn = (hf.model.language_model if hasattr(hf.model, "language_model") else hf.model).layers[1].self_attn
    attn = ours.model.layers[1].self_attn
    torch.testing.assert_close(attn.q_norm.weight, hf_attn.q_norm.weight + 1)  # (1 + w) norms
    assert attn.rotary_emb.rotary_dim == 8 and attn.attn.num_heads == 4
    if "Moe" in hf.config.architectures[0]:
        assert ours.model.layers[0].mlp.renormalize
    else:  # decode steps read the state slots on the device: capturable
        assert ours.supports_cuda_graphs


def test_partial_rotary_is_needed(models):
    """RoPE over the whole head (instead of its first quarter) breaks the match."""
    hf, ours = models
    attn = ours.model.layers[1].self_attn
    full = get_rope(32, 32, 256, attn.rotary_emb.base, is_neox_style=True)
    check_needed(ours, hf, [(attn, "rotary_emb", full)])


def test_state_dtype_from_config(tmp_path):
    """``mamba_ssm_dtype`` sets the recurrent state's dtype; the conv state keeps the model's."""
    config = transformers.Qwen3_5TextConfig(**TEXT, mamba_ssm_dtype="bfloat16")
    _, ours = hf_and_ours(config, tmp_path)
    assert ours.kv_cache_specs()[0].dtypes == (torch.float32, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_mixed_batch_matches_transformers(tmp_path):
    """On a GPU in float32 (the Gated DeltaNet CUDA kernels where the build has them, else the
    PyTorch ops there): a long prefill, chunked prefill, decode next to prefill and decode batches
    against transformers' float32 logits on the CPU."""
    hf, _ = CHECKPOINTS["moe"](tmp_path)
    ours = load_ours(tmp_path, dtype=torch.float32, device="cuda")
    check_single_prefill(ours, hf, length=150, atol=1e-3, device="cuda")
    hf_compare.check_mixed_batch(ours, hf, atol=1e-3, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_engine_logprobs_match_transformers(tmp_path):
    """The engine as users run it: float16, the CUDA attention backend (heads of 256, as Qwen3.5's),
    decode steps replayed from CUDA graphs that read and write the recurrent-state slots."""
    check_fp16_engine_logprobs(tmp_path, "qwen3_5")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_gpu_float16_error_is_transformers_own(tmp_path):
    """float16 on a GPU: the logits of a 150-token prompt are as far from float32 transformers'
    as transformers' own float16 run is (random weights this large make float16 visibly lossy)."""
    hf, _ = CHECKPOINTS["dense"](tmp_path)
    tokens = torch.randint(0, TINY["vocab_size"], (150,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf_compare.hf_logits(hf, tokens)
    own_error = (hf.half()(torch.tensor([tokens])).logits[0].float() - ref).abs().max().item()
    ours = load_ours(tmp_path, dtype=torch.float16, device="cuda")
    out = hf_compare.PagedRunner(ours, device="cuda").step({"x": tokens})["x"]
    assert (out - ref).abs().max().item() <= 2 * own_error + 1e-2
