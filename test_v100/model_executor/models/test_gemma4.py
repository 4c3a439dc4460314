"""Gemma 4 text (every kind: E2B/E4B-style per-layer inputs and KV sharing, the dense kind's
attention_k_eq_v, the MoE kind's routed experts) vs transformers, float32 and float16."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import transformers
from torch import nn

from vllm_volta.core.kv_cache_spec import FullAttentionSpec, SharedKVSpec, SlidingWindowSpec
from vllm_volta.model_executor.layers.rotary_embedding import ProportionalRotaryEmbedding, RotaryEmbedding
from vllm_volta.model_executor.models.gemma4_plan import layer_plans

from . import hf_compare
from .hf_compare import PagedRunner, check_needed, check_single_prefill, hf_logits, load_ours, save_random_hf_model

S, F = "sliding_attention", "full_attention"
BASE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            global_head_dim=32, vocab_size=120, max_position_embeddings=128, rms_norm_eps=1e-5,
            sliding_window=4, final_logit_softcapping=30.0, hidden_size_per_layer_input=0)
# Window 4 (the prompts are 9-21 tokens); full layers with heads of 32 (sliding: 16) and the
# default proportional RoPE (a quarter of the frequencies turning).
KINDS = {
    # per-layer inputs, the last two layers reading layers 2 (sliding) and 1 (full), double-wide MLPs there
    "e": dict(num_hidden_layers=5, layer_types=[S, F, S, S, F], hidden_size_per_layer_input=8,
              vocab_size_per_layer_input=120, num_kv_shared_layers=2, use_double_wide_mlp=True),
    # full layers: keys are values, one KV head of 32
    "dense": dict(num_hidden_layers=3, layer_types=[S, F, F], attention_k_eq_v=True, num_global_key_value_heads=1),
    # routed experts beside the MLP
    "moe": dict(num_hidden_layers=3, layer_types=[S, S, F], enable_moe_block=True, num_experts=4, top_k_experts=2,
                moe_intermediate_size=24),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tensors this small run faster on one CPU thread (the thread pool's hand-offs cost more than
    they save, many times more on a busy machine)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def text_config(kind: str, **overrides) -> transformers.Gemma4TextConfig:
    return transformers.Gemma4TextConfig(**{**BASE, **KINDS[kind], **overrides})


def scale_layers(hf: transformers.PreTrainedModel, scalars: list[float]) -> None:
    """Set each decoder layer's layer_scalar (a buffer: save_random_hf_model leaves it at 1)."""
    layers = hf.model.language_model.layers if hasattr(hf.model, "language_model") else hf.model.layers
    for layer, value in zip(layers, scalars):
        layer.layer_scalar.fill_(value)


def save_hf(config: transformers.PretrainedConfig, folder, scalars: list[float] | None = None):
    hf = save_random_hf_model(config, folder)
    scale_layers(hf, scalars or [0.6 + 0.2 * i for i in range(config.num_hidden_layers)])
    hf.save_pretrained(folder)
    return hf


@torch.no_grad()
def soften_attention(hf: transformers.PreTrainedModel, folder) -> None:
    """q/k norm weights / 4, saved again: at attention scale 1.0, random norms of ~1 give scores of
    ~head_size, where float16 rounding of q and k swings the softmax (transformers' own float16 run
    is as far off): the float16 comparisons need realistic scores."""
    for name, p in hf.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            p.mul_(0.25)
    hf.save_pretrained(folder)


@pytest.fixture(scope="module", params=list(KINDS))
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gemma4_{request.param}")
    hf = save_hf(text_config(request.param), folder)
    return hf, load_ours(folder)


# The shared model checks (single prefill; chunked prefill, decode and a prefix hit), per kind.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


def test_kv_cache_specs_per_layer():
    e = layer_plans(text_config("e"))
    assert [(p.head_dim, p.num_kv_heads, p.sliding_window, p.kv_source, p.stores_kv, p.double_wide_mlp)
            for p in e] == [(16, 2, 4, None, False, False), (32, 2, None, None, True, False),
                            (16, 2, 4, None, True, False), (16, 2, 4, 2, False, True), (32, 2, None, 1, False, True)]
    dense = layer_plans(text_config("dense"))
    assert [(p.head_dim, p.num_kv_heads, p.k_eq_v) for p in dense] == [(16, 2, False), (32, 1, True), (32, 1, True)]


def test_loaded_layers(models):
    hf, ours = models
    sliding, full = SlidingWindowSpec(2, 16, torch.float32, sliding_window=4), FullAttentionSpec(2, 32, torch.float32)
    expected = {"e": [sliding, full, sliding, SharedKVSpec(source=2), SharedKVSpec(source=1)],
                "dense": [sliding, FullAttentionSpec(1, 32, torch.float32), FullAttentionSpec(1, 32, torch.float32)],
                "moe": [sliding, sliding, full]}
    kind = "e" if ours.model.per_layer_size else "dense" if ours.config.attention_k_eq_v else "moe"
    assert ours.kv_cache_specs() == expected[kind]
    layers = [layer.self_attn for layer in ours.model.layers]
    full = next(a for a in layers if a.attn.impl.sliding_window is None)
    sliding = next(a for a in layers if a.attn.impl.sliding_window == 4)
    assert isinstance(full.rotary_emb, ProportionalRotaryEmbedding) and full.rotary_emb.head_size == 32
    assert type(sliding.rotary_emb) is RotaryEmbedding and sliding.rotary_emb.head_size == 16
    assert {a.attn.scale for a in layers} == {1.0}
    assert ours.logits_processor.soft_cap == 30.0
    assert ours.lm_head.weight is ours.model.embed_tokens.weight


def test_proportional_rope_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = text_config("e", rope_parameters={
        S: {"rope_type": "default", "rope_theta": 10000.0},
        F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6, "factor": 2.0}})
    want, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu", layer_type=F)
    ours = ProportionalRotaryEmbedding(32, 16, 1e6, True, 0.25, 2.0)
    torch.testing.assert_close(ours._compute_inv_freq(), want)
    assert int((want != 0).sum()) == 4  # a quarter of the 16 pairs turn; the rest pass through
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        ProportionalRotaryEmbedding(32, 16, 1e6, True, 1.5)


def _feature_settings(ours) -> dict[str, list[tuple[object, str, object]]]:
    layers = list(ours.model.layers)
    attns = [layer.self_attn for layer in layers]
    full = next(a for a in attns if a.attn.impl.sliding_window is None)
    plain = RotaryEmbedding(32, 32, 128, full.rotary_emb.base)
    settings = {
        "sliding_window": [(a.attn.impl, "sliding_window", None) for a in attns],
        "proportional_rope": [(a, "rotary_emb", plain) for a in attns if a.rotary_emb is full.rotary_emb],
        "layer_scalar": [(layer, "layer_scalar", nn.Parameter(torch.ones(1), requires_grad=False))
                         for layer in layers],
        "final_soft_cap": [(ours.logits_processor, "soft_cap", None)],
    }
    if ours.model.per_layer_size:
        settings["per_layer_inputs"] = [(layer, "per_layer_size", 0) for layer in layers]
    if layers[0].feed_forward.moe:
        settings["expert_scales"] = [(layer.feed_forward.experts, "expert_scales", nn.Parameter(torch.ones(4), requires_grad=False))
                                    for layer in layers]
    return settings


def test_each_feature_changes_the_logits(models):
    """Each Gemma 4 feature switched off, the logits no longer match: the comparisons depend on it."""
    hf, ours = models
    for name, setting in _feature_settings(ours).items():
        try:
            check_needed(ours, hf, setting)
        except BaseException as e:  # name the feature in the failure
            raise AssertionError(f"feature {name}: {e}") from e


def test_float16_residual_stays_finite(models, tmp_path):
    """Layer scalars that grow the residual stream past float16's range: transformers in float16
    overflows (inf/NaN); ours in float16 (the stream in float32) stays finite and close to
    transformers in float32."""
    hf, ours = models
    folder = tmp_path / "big"
    scale_layers(hf, [300.0] * hf.config.num_hidden_layers)
    try:
        hf.save_pretrained(folder)
        tokens = torch.randint(0, hf.config.vocab_size, (13,), generator=torch.Generator().manual_seed(3)).tolist()
        with torch.no_grad():
            plain = hf.half()(torch.tensor([tokens])).logits
        hf.float()
        assert not torch.isfinite(plain).all(), "the float16 reference should overflow"
        ours16 = load_ours(folder, dtype=torch.float16)
        assert ours16.model.residual_dtype == torch.float32
        out = PagedRunner(ours16, defer_final_norm=True).step({"x": tokens})["x"]
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, hf_logits(hf, tokens), atol=0.1, rtol=0.02)
    finally:
        hf.float()
        scale_layers(hf, [0.6 + 0.2 * i for i in range(hf.config.num_hidden_layers)])


def test_float32_residual_only_in_float16(tmp_path):
    save_hf(text_config("moe"), tmp_path)
    assert load_ours(tmp_path, dtype=torch.float32).model.residual_dtype == torch.float32
    assert load_ours(tmp_path, dtype=torch.bfloat16).model.residual_dtype == torch.bfloat16


def test_conditional_generation_checkpoint_serves_its_language_model(tmp_path):
    """A Gemma4ForConditionalGeneration checkpoint (as the hub ships every size): its text_config's
    model, the language-model weights only, logits equal to transformers' on text-only input."""
    text = text_config("e")
    vision = transformers.Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    config = transformers.Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict())
    torch.manual_seed(0)
    hf = transformers.Gemma4ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.15)
    scale_layers(hf, [0.7, 1.2, 0.9, 1.1, 0.8])
    hf.save_pretrained(tmp_path)
    ours = load_ours(tmp_path)
    assert type(ours).__name__ == "Gemma4ForConditionalGeneration"
    assert not any("vision" in name for name, _ in ours.named_parameters())
    check_single_prefill(ours, hf)


def test_language_model_weight_names():
    from vllm_volta.model_executor.models.gemma4 import _SKIPPED_PREFIXES
    from vllm_volta.model_executor.models.utils import language_model_weights

    t = torch.zeros(1)
    names = ["model.language_model.layers.0.self_attn.q_proj.weight", "model.vision_tower.encoder.x.weight",
             "model.audio_tower.y.weight", "model.embed_vision.embedding_projection.weight",
             "model.embed_audio.embedding_projection.weight", "model.language_model.norm.weight", "lm_head.weight"]
    assert [n for n, _ in language_model_weights(((n, t) for n in names), _SKIPPED_PREFIXES)] == [
        "model.layers.0.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"]


def test_config_errors_name_the_field():
    legacy = SimpleNamespace(num_hidden_layers=2, layer_types=[S, F], hidden_size=64, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, global_head_dim=32, attention_k_eq_v=True,
                             num_global_key_value_heads=1, sliding_window=4, num_kv_shared_layers=0)
    plans = layer_plans(legacy)  # a config without per_layer_config: global_head_dim beside head_dim
    assert [(p.head_dim, p.num_kv_heads, p.sliding_window) for p in plans] == [(16, 2, 4), (32, 1, None)]
    with pytest.raises(ValueError, match="num_kv_shared_layers"):
        layer_plans(SimpleNamespace(**{**vars(legacy), "num_kv_shared_layers": 2}))
    with pytest.raises(ValueError, match="layer_types"):
        layer_plans(SimpleNamespace(**{**vars(legacy), "layer_types": [S, "chunked"]}))
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        from vllm_volta.model_executor.models.gemma4 import Gemma4ForCausalLM
        Gemma4ForCausalLM(text_config("moe", moe_intermediate_size=None), dtype=torch.float32)


@pytest.mark.parametrize("arch", ["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"])
def test_auto_dtype_is_float16_without_bfloat16(clean_env, arch):
    """Where bfloat16 is missing (Volta), "auto" runs Gemma 4 (model types gemma4_text and
    gemma4) in float16, its residual stream in float32; Gemma 2 / 3 go to float32."""
    from vllm_volta.config import ModelConfig
    from vllm_volta.platforms import cuda

    cfg = text_config("dense")
    if arch == "Gemma4ForConditionalGeneration":
        cfg = transformers.Gemma4Config(text_config=cfg.to_dict())
    cfg.dtype = torch.bfloat16
    cfg.architectures = [arch]
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    monkey = pytest.MonkeyPatch()
    monkey.setattr("vllm_volta.platforms.current_platform", cuda.CudaPlatform(), raising=False)
    try:
        assert ModelConfig(model="tiny", hf_config=cfg).dtype == torch.float16
    finally:
        monkey.undo()


def _tp_worker(rank: int, folder: str, init_file: str) -> None:
    import torch.distributed as dist

    from vllm_volta.model_executor.layers import parallel_state as ps

    from .hf_compare import check_mixed_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ps.set_tensor_parallel(rank, 2)
        model = load_ours(folder)
        # sliding layers: 2 KV heads, one per rank; full layers: 1 KV head, on both ranks
        assert [(s.num_kv_heads, s.head_size) if hasattr(s, "head_size") else s.source
                for s in model.kv_cache_specs()] == [(1, 16), (1, 32), (1, 16), 2, 1]
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).float().eval()
        check_mixed_batch(model, hf)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # as test_parallel_state: skip gloo's teardown


def test_tp2_matches_transformers(tmp_path):
    """Two gloo ranks on a model with every kind's features at once (per-layer inputs, KV sharing,
    k_eq_v with one full-layer KV head replicated on both ranks, experts split by intermediate size)."""
    import torch.multiprocessing as mp

    config = text_config("e", attention_k_eq_v=True, num_global_key_value_heads=1, enable_moe_block=True,
                         num_experts=4, top_k_experts=2, moe_intermediate_size=24)
    save_hf(config, tmp_path / "ckpt")
    mp.spawn(_tp_worker, args=(str(tmp_path / "ckpt"), str(tmp_path / "rendezvous")), nprocs=2)


@torch.no_grad()
def _hf_greedy(hf: transformers.PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):  # the whole sequence each time: no cache on the reference side
        seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_engine_greedy_matches_transformers(models, tmp_path):
    """LLM.generate on the CPU (the runner allocating each layer's cache from kv_cache_specs,
    chunked prefill of 16-token steps) gives transformers' greedy tokens."""
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    hf, _ = models
    hf.config.architectures = ["Gemma4ForCausalLM"]
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, max_num_seqs=4, max_model_len=64,
              max_num_batched_tokens=16)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist() for n in (9, 21)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == _hf_greedy(hf, prompt, 6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", list(KINDS))
def test_fp16_cuda_backends_match_transformers(kind, tmp_path):
    """float16 on the GPU with the float32 residual stream, on both attention backends with Gemma
    4's head sizes (256 sliding, 512 full) and smaller ones: chunked prefill, decode and a prefix
    hit within float16 noise of transformers in float32; the KV-shared layers' prefill reads the
    keys their source layer computed in the same step."""
    from vllm_volta.attention.backends.torch_sdpa import TorchSDPABackend
    from vllm_volta.attention.backends.volta_paged import VoltaPagedBackend
    from vllm_volta.model_executor.model_loader.loader import get_model
    from vllm_volta.transformers_utils.config import resolve_model_source

    from .hf_compare import check_mixed_batch

    for backend, head_dim, global_head_dim in ((VoltaPagedBackend, 256, 512), (VoltaPagedBackend, 128, 256),
                                               (TorchSDPABackend, 256, 512)):
        folder = tmp_path / f"{backend.name}_{head_dim}"
        hf = save_hf(text_config(kind, hidden_size=128, num_attention_heads=2, head_dim=head_dim,
                                 global_head_dim=global_head_dim), folder)
        soften_attention(hf, folder)
        source = resolve_model_source(str(folder))
        model_config = SimpleNamespace(model=str(folder), hf_config=source.hf_config, dtype=torch.float16,
                                       load_format="auto", model_path=str(source.path), revision=None)
        ours = get_model(model_config, "cuda", attn_backend=backend)
        check_mixed_batch(ours, hf, atol=6e-2, device="cuda")  # hf stays on the CPU, in float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["e", "dense"])
def test_fp16_engine_logprobs_match_transformers(kind, tmp_path):
    """The engine as users run it on the GPU (float16, VOLTA_PAGED with heads of 256 / 512 as Gemma
    4's, CUDA graphs over KV-shared layers): every prompt and generated token's logprob within
    float16 noise of transformers' (float32)."""
    from test_v100.worker.tiny_models import VOCAB_SIZE

    from .hf_compare import check_engine_logprobs

    config = text_config(kind, hidden_size=256, num_attention_heads=2, head_dim=256, global_head_dim=512,
                         vocab_size=VOCAB_SIZE, vocab_size_per_layer_input=VOCAB_SIZE, max_position_embeddings=512,
                         sliding_window=16)
    config.architectures = ["Gemma4ForCausalLM"]
    hf = save_hf(config, tmp_path)
    soften_attention(hf, tmp_path)
    check_engine_logprobs(tmp_path, hf)
