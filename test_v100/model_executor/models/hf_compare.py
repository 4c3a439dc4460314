"""Helpers for model tests: random-weight HF checkpoints and a tiny paged-KV runner.

The runner plays the model runner's part with the real metadata builder: it keeps per-sequence
token lists and block lists (blocks handed out in a scrambled order), builds AttentionMetadata
for a step, and returns the logits of each sequence's new tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from vllm_volta.attention.backends.torch_sdpa import TorchSDPABackend
from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import build_attn_metadata, compute_positions
from vllm_volta.core.kv_cache_spec import allocate_caches, has_recurrent_state
from vllm_volta.model_executor.model_loader.loader import get_model
from vllm_volta.transformers_utils.config import resolve_model_source

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=120, max_position_embeddings=128,
            rms_norm_eps=1e-5)


def save_random_hf_model(config: transformers.PretrainedConfig, folder: Path, seed: int = 0,
                         max_shard_size: str | None = None) -> transformers.PreTrainedModel:
    """Create the HF model with random weights large enough to matter (norm weights around 1,
    biases non-zero), save it as safetensors to ``folder`` and return it (fp32, eval)."""
    torch.manual_seed(seed)
    # Eager attention: the reference that applies soft caps and sliding windows in every
    # transformers version (before 5.24, Gemma 2's sdpa path skipped the soft cap).
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
            else:
                p.normal_(0.0, 0.15)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    hf.save_pretrained(folder, **kwargs)
    return hf


def load_ours(folder: Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
              load_format: str = "auto") -> torch.nn.Module:
    """Our model through the production path: resolve_model_source + get_model."""
    source = resolve_model_source(str(folder))
    model_config = SimpleNamespace(model=str(folder), hf_config=source.hf_config, dtype=dtype,
                                   load_format=load_format, model_path=str(source.path),
                                   revision=None)
    return get_model(model_config, device, attn_backend=TorchSDPABackend)


def hf_and_ours(config: transformers.PretrainedConfig, folder: Path) -> tuple[transformers.PreTrainedModel, torch.nn.Module]:
    """A random HF model of ``config`` saved to ``folder``, and ours loaded from it (a model test's
    fixture)."""
    hf = save_random_hf_model(config, folder)
    return hf, load_ours(folder)


@torch.no_grad()
def hf_logits(hf: transformers.PreTrainedModel, token_ids: list[int]) -> torch.Tensor:
    """[len, vocab] float32 logits of the HF model for one full sequence."""
    return hf(torch.tensor([token_ids])).logits[0].float()


@dataclass
class _Seq:
    tokens: list[int] = field(default_factory=list)  # tokens already in the cache
    blocks: list[int] = field(default_factory=list)
    slot: int = -1  # recurrent-state slot (hybrid models)


class PagedRunner:
    """Drives ``model`` step by step over a paged KV cache. ``defer_final_norm``: as the engine,
    the model returns the residual stream and the final norm runs in ``compute_logits``."""

    def __init__(self, model: torch.nn.Module, num_blocks: int = 64, block_size: int = 4,
                 device: str = "cpu", seed: int = 0, defer_final_norm: bool = False) -> None:
        self.defer_final_norm = defer_final_norm
        if hasattr(model, "kv_cache_specs"):  # per-layer shapes, recurrent state (hybrid models)
            specs = model.kv_cache_specs()
            self.kv_caches = allocate_caches(specs, num_blocks, block_size, 8, torch.device(device))
            self.state_slots: list[int] | None = (list(range(7, 0, -1)) if has_recurrent_state(specs)
                                                  else None)
        else:
            attn = [m for m in model.modules() if isinstance(m, Attention)]  # per-rank head counts
            shape = (2, num_blocks, block_size, attn[0].num_kv_heads, attn[0].head_size)
            dtype = next(model.parameters()).dtype
            self.kv_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in attn]
            self.state_slots = None
        self.model, self.block_size, self.device = model, block_size, device
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)  # non-contiguous blocks exercise the block table
        self.seqs: dict[str, _Seq] = {}

    def share_prefix(self, new_id: str, src_id: str, num_blocks: int) -> None:
        """Start ``new_id`` with the first ``num_blocks`` full blocks of ``src_id`` (a prefix-cache
        hit: those tokens are computed and their KV is read from the shared blocks)."""
        if self.state_slots is not None:
            raise ValueError("prefix sharing needs a state snapshot; hybrid models run without it")
        src = self.seqs[src_id]
        n = num_blocks * self.block_size
        self.seqs[new_id] = _Seq(tokens=src.tokens[:n], blocks=src.blocks[:num_blocks])

    @torch.no_grad()
    def step(self, new_tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Run one batch: sequence id -> its new tokens. Returns id -> [n_new, vocab] logits."""
        ids = list(new_tokens)
        for sid in ids:
            if sid not in self.seqs:
                self.seqs[sid] = _Seq(slot=self.state_slots.pop() if self.state_slots is not None else -1)
            seq = self.seqs[sid]
            needed = -(-(len(seq.tokens) + len(new_tokens[sid])) // self.block_size)
            while len(seq.blocks) < needed:
                seq.blocks.append(self.free.pop())
        done = [len(self.seqs[s].tokens) for s in ids]
        num_new = [len(new_tokens[s]) for s in ids]
        slots = [self.seqs[s].slot for s in ids] if self.state_slots is not None else None
        md = build_attn_metadata(done, num_new, [self.seqs[s].blocks for s in ids],
                                 self.block_size, self.device, state_slots=slots)
        input_ids = torch.tensor([t for s in ids for t in new_tokens[s]], device=self.device)
        positions = compute_positions(done, num_new).to(self.device)
        defer = self.defer_final_norm
        hidden = self.model(input_ids, positions, self.kv_caches, md, final_norm=not defer)
        logits = self.model.compute_logits(hidden, apply_final_norm=defer).float().cpu()
        out, start = {}, 0
        for sid, n in zip(ids, num_new):
            out[sid] = logits[start:start + n]
            self.seqs[sid].tokens.extend(new_tokens[sid])
            start += n
        return out


def check_mixed_batch(model: torch.nn.Module, hf: transformers.PreTrainedModel,
                      atol: float = 2e-4, device: str = "cpu", seed: int = 0) -> None:
    """Chunked prefill, prefill next to decode, decode batches and a prefix-cache hit, each
    step's logits checked against HF's full-sequence logits at the same positions; with the
    final norm in the model and deferred to compute_logits (as the engine runs it)."""
    for defer in (False, True):
        _check_mixed_batch(model, hf, atol, device, seed, defer)


def _check_mixed_batch(model: torch.nn.Module, hf: transformers.PreTrainedModel, atol: float,
                       device: str, seed: int, defer_final_norm: bool) -> None:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    full = {s: torch.randint(0, vocab, (n,), generator=g).tolist()
            for s, n in (("a", 14), ("b", 17), ("c", 9))}
    full["d"] = full["a"][:8] + torch.randint(0, vocab, (5,), generator=g).tolist()
    ref = {s: hf_logits(hf, toks) for s, toks in full.items()}
    runner = PagedRunner(model, device=device, seed=seed, defer_final_norm=defer_final_norm)
    schedule = [
        {"a": (0, 11), "b": (0, 6)},  # a: whole prompt; b: first chunk
        {"a": (11, 12), "b": (6, 14), "c": (0, 6)},  # decode next to a chunk and a prefill
        {"a": (12, 13), "b": (14, 15), "c": (6, 7)},  # all decode
        {"a": (13, 14), "b": (15, 16), "c": (7, 8), "d": (8, 12)},  # d hits a's first 2 blocks
        {"b": (16, 17), "c": (8, 9), "d": (12, 13)},
    ]
    for step_no, step in enumerate(schedule):
        if "d" in step and "d" not in runner.seqs:
            if runner.state_slots is None:
                runner.share_prefix("d", "a", 2)
            else:  # recurrent state: no prefix sharing, d computes its prefix here
                step = {**step, "d": (0, step["d"][1])}
        out = runner.step({s: full[s][lo:hi] for s, (lo, hi) in step.items()})
        for s, (lo, hi) in step.items():
            torch.testing.assert_close(out[s], ref[s][lo:hi], atol=atol, rtol=1e-4,
                                       msg=lambda m: f"step {step_no}, seq {s}, deferred final norm "
                                                     f"{defer_final_norm}: {m}")


def check_single_prefill(model: torch.nn.Module, hf: transformers.PreTrainedModel,
                         length: int = 21, atol: float = 2e-4, device: str = "cpu") -> None:
    """One prompt in one step: logits at every position equal HF's."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (length,), generator=g).tolist()
    out = PagedRunner(model, device=device).step({"x": tokens})["x"]
    torch.testing.assert_close(out, hf_logits(hf, tokens), atol=atol, rtol=1e-4)


def check_needed(model: torch.nn.Module, hf: transformers.PreTrainedModel,
                 settings: list[tuple[object, str, object]]) -> None:
    """With each ``(obj, attr, value)`` applied (a feature switched off, e.g. an attention impl's
    sliding_window set to None), ``model`` no longer matches ``hf`` (check_single_prefill): the
    comparisons depend on the feature, so transformers' reference applies it too."""
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in settings]
    try:
        for obj, attr, value in settings:
            setattr(obj, attr, value)
        with pytest.raises(AssertionError):
            check_single_prefill(model, hf)
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)


@torch.no_grad()
def check_fp16_decode_fusions(hf: transformers.PreTrainedModel, folder: Path, monkeypatch) -> None:
    """`hf` saved to `folder` and loaded as ours, float16 on a GPU: decode steps of 2 and 1
    sequences run the fused gemv epilogues (gemv_rope_cache for qkv + RoPE + the cache write, gemv_silu_and_mul, gemv_add: the layer
    returns the residual with the sum in it) and the pre-norms as gemv prologues (qkv and
    gate_up get a norm_weight), and the lm_head's gemv takes the deferred final norm as its
    prologue; their logits match HF's and, closely, the same model with gemv
    switched off (cuBLAS + norms)."""
    from vllm_volta import _custom_ops as ops

    hf.save_pretrained(folder)
    calls: dict[str, int] = {"gemv": 0, "gemv_rope_cache": 0, "gemv_silu_and_mul": 0, "gemv_add": 0}
    normed: dict[str, int] = dict.fromkeys(calls, 0)

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            normed[name] += kwargs.get("norm_weight") is not None
            return real(*args, **kwargs)
        return call

    for name in calls:
        monkeypatch.setattr(ops, name, counted(name, getattr(ops, name)))
    g = torch.Generator().manual_seed(2)
    full = {s: torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist() for s, n in (("a", 11), ("b", 9))}
    ref = {s: hf_logits(hf, toks) for s, toks in full.items()}
    schedule = [{"a": (0, 8), "b": (0, 6)}, {"a": (8, 9), "b": (6, 7)}, {"a": (9, 10), "b": (7, 8)},
                {"a": (10, 11)}]
    results = []
    for use_gemv in (True, False):
        model = load_ours(folder, dtype=torch.float16, device="cuda")
        for layer in model.modules():
            if hasattr(layer, "use_gemv"):
                layer.use_gemv = use_gemv
        runner = PagedRunner(model, device="cuda", defer_final_norm=True)  # as the engine
        results.append([runner.step({s: full[s][lo:hi] for s, (lo, hi) in step.items()}) for step in schedule])
    layers = model.config.num_hidden_layers
    # 3 decode steps x layers, once each, and the lm_head once per decode step (2, 2 and 1 rows,
    # the final norm as its prologue); the prefill step and the cuBLAS run take none.
    expected = 3 * layers
    assert calls == {"gemv": 3, "gemv_rope_cache": expected, "gemv_silu_and_mul": expected, "gemv_add": 2 * expected}
    assert normed == {"gemv": 3, "gemv_rope_cache": expected, "gemv_silu_and_mul": expected, "gemv_add": 0}
    for step_no, step in enumerate(schedule):
        for s, (lo, hi) in step.items():
            fused, plain = results[0][step_no][s], results[1][step_no][s]
            torch.testing.assert_close(fused, ref[s][lo:hi], atol=3e-2, rtol=1e-2)
            torch.testing.assert_close(fused, plain, atol=1e-2, rtol=1e-2)


def check_fp16_engine_logprobs(tmp_path: Path, arch: str, **overrides) -> None:
    """The engine as users run it (fp16, the CUDA backend with heads of 256 as in Gemma, CUDA
    graphs) on a tiny ``arch`` model (tiny_models.py, with ``overrides``): every prompt and
    generated token's logprob is within fp16 noise of transformers' (fp32) on the same sequence,
    so the check does not depend on which token a near-tie picks."""
    from test_v100.worker.tiny_models import save_tiny_model

    hf = save_tiny_model(tmp_path, arch, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=256, **overrides)
    check_engine_logprobs(tmp_path, hf)


def check_engine_logprobs(folder: Path, hf: transformers.PreTrainedModel) -> None:
    """The fp16 engine on the CUDA backend with CUDA graphs, on the checkpoint in ``folder``: every
    prompt and generated token's logprob within 0.1 of ``hf``'s (fp32) on the same sequence."""
    from test_v100.worker.tiny_models import random_prompts
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    llm = LLM(str(folder), skip_tokenizer_init=True, dtype="float16", gpu_memory_utilization=0.3,
              max_num_seqs=8)
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.attn_backend.name == "VOLTA_PAGED" and runner.graph_runner is not None
    prompts = random_prompts(4, 5, 60, seed=7)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0, prompt_logprobs=0)
    outs = llm.generate(prompts, params, use_tqdm=False)
    hf = hf.cuda()
    for prompt, out in zip(prompts, outs):
        assert out.error is None, out.error
        gen = list(out.outputs[0].token_ids)
        seq = prompt + gen
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([seq], device="cuda")).logits[0].float(), -1)
        want = [ref[i - 1, seq[i]].item() for i in range(1, len(seq))]
        got = [out.prompt_logprobs[i][seq[i]].logprob for i in range(1, len(prompt))]
        got += [step[tok].logprob for step, tok in zip(out.outputs[0].logprobs, gen)]
        assert len(got) == len(want)
        worst = max(range(len(got)), key=lambda i: abs(got[i] - want[i]))
        assert abs(got[worst] - want[worst]) < 0.1, (f"position {worst + 1} of {len(seq)}: logprob "
                                                     f"{got[worst]:.4f}, transformers {want[worst]:.4f}")


# The two checks of every model test module's ``models`` fixture ((HF model, ours)): a module
# imports them and pytest runs them there.
def test_single_prefill_matches_transformers(models):
    check_single_prefill(models[1], models[0])


def test_mixed_batch_matches_transformers(models):
    check_mixed_batch(models[1], models[0])
