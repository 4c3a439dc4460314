"""The engine on CPU with an FP8 KV cache (kv_cache_dtype fp8 / fp8_e5m2), tiny random Llama.

- Exact reference: transformers with attention that reads FP8-rounded keys / values (an
  attention function registered through transformers' AttentionInterface that quantizes and
  dequantizes K / V as the cache does): same greedy tokens, same logprobs.
- Against the FP32 KV run: logprobs within a stated bound and greedy tokens equal up to a
  near-tie (see FP32_BOUND).
- Capacity: the same byte budget holds as many more blocks as the element is smaller.
- Checkpoint k / v scales: loaded into the layers, logged, used by the write and the reads.
- Prefix-cache hits and preemption give the same tokens as a plain run.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from test_v100.worker.tiny_models import hf_greedy, random_prompts, save_tiny_model
from vllm_volta.attention.kv_cache_dtype import dequantize, quantize
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.sampling_params import SamplingParams

FORMATS = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# Max |logprob difference| against the FP32 KV run, on this model, while the greedy tokens agree.
# Each cached element is rounded to within 2^-4 (e4m3: 3 mantissa bits) or 2^-3 (e5m2: 2 bits)
# relative; this tiny model's random weights (init range 0.15) give attention logits of several
# units, so one rounding step moves its log-probs by a few hundredths: measured at most 0.09
# (e4m3) and 0.49 (e5m2) over these prompts. The bounds leave about 2x and 1.5x room; a wrong
# scale, an unscaled read or a mis-placed token moves them by whole units.
FP32_BOUND = {"fp8": 0.2, "fp8_e5m2": 0.75}
_ids = itertools.count()
_EMULATED = {"dtype": torch.float8_e4m3fn, "k": 1.0, "v": 1.0}


def _fp8_kv_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' eager attention over keys / values rounded as an FP8 cache holds them."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    dtype, ks, vs = _EMULATED["dtype"], _EMULATED["k"], _EMULATED["v"]
    key = dequantize(quantize(key, ks, dtype), ks, key.dtype)
    value = dequantize(quantize(value, vs, dtype), vs, value.dtype)
    return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)


@pytest.fixture(scope="module")
def hf_fp8(tmp_path_factory):
    """(model dir, HF model reading an FP8-rounded KV cache)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register("fp8_kv_reference", _fp8_kv_attention)
    # A registered attention function gets no mask unless one is registered with it.
    AttentionMaskInterface.register("fp8_kv_reference", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    path = tmp_path_factory.mktemp("tiny_llama_fp8kv")
    model = save_tiny_model(path, "llama")
    model.config._attn_implementation = "fp8_kv_reference"
    return path, model


def make_engine(path, **kwargs) -> LLMEngine:
    kwargs.setdefault("cpu_kvcache_space", 0.01)
    kwargs.setdefault("skip_tokenizer_init", True)
    kwargs.setdefault("dtype", "float32")
    return LLMEngine.from_engine_args(EngineArgs(model=str(path), **kwargs))


def run(engine: LLMEngine, prompts, params):
    ids = [f"r{next(_ids)}" for _ in prompts]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[rid].outputs[0] for rid in ids]


PROMPTS = [[5, 6, 7, 8], random_prompts(1, 20, 20, seed=1)[0], random_prompts(1, 45, 45)[0]]


@pytest.mark.parametrize("kv", list(FORMATS))
def test_fp8_greedy_matches_transformers_reading_an_fp8_cache(hf_fp8, kv):
    path, hf_model = hf_fp8
    _EMULATED.update(dtype=FORMATS[kv], k=1.0, v=1.0)
    # A small token budget: chunked prefills over the cached (FP8) prefix next to decodes.
    outs = run(make_engine(path, kv_cache_dtype=kv, max_num_batched_tokens=16), PROMPTS,
               SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3))
    for prompt, out in zip(PROMPTS, outs):
        assert list(out.token_ids) == hf_greedy(hf_model, prompt, 12)
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        for token, lp in out.logprobs[0].items():
            assert abs(lp.logprob - float(ref[token])) < 1e-4


@pytest.mark.parametrize("kv", list(FORMATS))
def test_fp8_within_the_bound_of_the_fp32_kv_run(hf_fp8, kv):
    path, _ = hf_fp8
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    exact = run(make_engine(path, max_num_batched_tokens=16), PROMPTS, params)
    fp8 = run(make_engine(path, kv_cache_dtype=kv, max_num_batched_tokens=16), PROMPTS, params)
    bound = FP32_BOUND[kv]
    for a, b in zip(exact, fp8):
        for i, (ta, tb) in enumerate(zip(a.token_ids, b.token_ids)):
            top2 = sorted((lp.logprob for lp in a.logprobs[i].values()), reverse=True)[:2]
            if ta != tb:  # only where the FP32 run's top two are within the bound of a tie
                assert top2[0] - top2[1] < 2 * bound, (i, top2)
                break
            assert abs(a.logprobs[i][ta].logprob - b.logprobs[i][ta].logprob) <= bound


@pytest.mark.parametrize("dtype,ratio", [("float16", 2), ("float32", 4)])
def test_fp8_cache_holds_more_blocks_in_the_same_budget(hf_fp8, dtype, ratio):
    """One byte per cached element against the model dtype's 2 (float16: twice the blocks) or 4."""
    path, _ = hf_fp8
    blocks = {kv: make_engine(path, kv_cache_dtype=kv, cpu_kvcache_space=0.002, max_num_seqs=256, dtype=dtype)
              .vllm_config.cache_config.num_gpu_blocks for kv in ("auto", "fp8", "fp8_e5m2")}
    assert blocks["fp8"] == blocks["fp8_e5m2"] == ratio * blocks["auto"]


@pytest.fixture(scope="module")
def scaled_checkpoint(hf_fp8, tmp_path_factory):
    """The tiny model's checkpoint plus per-layer k_scale / v_scale tensors, as FP8 checkpoints
    carry them (layer 0 as self_attn.k_scale / v_scale, layer 1 as a legacy kv_scale)."""
    import shutil

    from safetensors.torch import load_file, save_file

    src, _ = hf_fp8
    path = tmp_path_factory.mktemp("tiny_llama_kv_scales")
    for f in src.iterdir():
        shutil.copy(f, path / f.name)
    weights = load_file(str(path / "model.safetensors"))
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor(0.37)
    weights["model.layers.0.self_attn.v_scale"] = torch.tensor(1.9)
    weights["model.layers.1.self_attn.kv_scale"] = torch.tensor(0.6)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_checkpoint_scales_are_loaded_logged_and_used(hf_fp8, scaled_checkpoint, caplog):
    """Per-layer scales: transformers reading a cache of x / scale (rounded) times scale."""
    _, hf_model = hf_fp8
    engine = make_engine(scaled_checkpoint, kv_cache_dtype="fp8", max_num_batched_tokens=16)
    runner = engine.executor.worker.model_runner
    impls = [layer.self_attn.attn.impl for layer in runner.model.model.layers]
    assert [(i.k_scale, i.v_scale) for i in impls] == [(pytest.approx(0.37), pytest.approx(1.9)),
                                                        (pytest.approx(0.6), pytest.approx(0.6))]
    outs = run(engine, PROMPTS[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    layer_scales = {0: (impls[0].k_scale, impls[0].v_scale), 1: (impls[1].k_scale, impls[1].v_scale)}

    def per_layer(module, query, key, value, attention_mask, **kwargs):
        _EMULATED.update(dtype=torch.float8_e4m3fn, k=layer_scales[module.layer_idx][0],
                         v=layer_scales[module.layer_idx][1])
        return _fp8_kv_attention(module, query, key, value, attention_mask, **kwargs)

    from transformers import AttentionInterface
    AttentionInterface.register("fp8_kv_reference", per_layer)
    try:
        for prompt, out in zip(PROMPTS[:2], outs):
            assert list(out.token_ids) == hf_greedy(hf_model, prompt, 8)
    finally:
        AttentionInterface.register("fp8_kv_reference", _fp8_kv_attention)


def test_scales_are_logged_once(scaled_checkpoint, capsys):
    make_engine(scaled_checkpoint, kv_cache_dtype="fp8")
    logged = capsys.readouterr()
    text = logged.out + logged.err
    assert text.count("KV cache dtype fp8 (float8_e4m3fn, 1 byte per element): k/v scales from the "
                      "checkpoint for 2 of 2 attention layers") == 1
    assert "KV cache (fp8): " in text  # the capacity line names the cache dtype


def test_prefix_hits_and_preemption_with_an_fp8_cache(hf_fp8):
    path, _ = hf_fp8
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    shared = random_prompts(1, 40, 40, seed=5)[0]
    prompts = [shared + [10, 11, 12], shared + [20, 21]]
    reference = run(make_engine(path, kv_cache_dtype="fp8", enable_prefix_caching=False), prompts, greedy)
    engine = make_engine(path, kv_cache_dtype="fp8", block_size=8)
    run(engine, prompts[:1], greedy)
    hits = run(engine, prompts, greedy)  # both read the 40 shared tokens back from the FP8 cache
    assert [o.token_ids for o in hits] == [o.token_ids for o in reference]
    assert engine.get_stats().prefix_cache_hits_total >= 80
    many = random_prompts(6, 8, 20, seed=7)
    reference = run(make_engine(path, kv_cache_dtype="fp8"), many, greedy)
    tight = make_engine(path, kv_cache_dtype="fp8", block_size=4, num_gpu_blocks_override=25)
    outs = run(tight, many, greedy)
    assert tight.get_stats().num_preemptions_total > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv", list(FORMATS))
def test_gpu_fp8_cache_graphs_match_eager(tmp_path, kv):
    """VOLTA_PAGED with an FP8 cache (float16 model, heads of 64): decode in CUDA graphs gives the
    eager tokens (RoPE then the quantizing write: the fused RoPE write takes no FP8 cache); blocks
    take half the bytes of the float16 cache; a fresh prompt's prefill attends to its new keys /
    values as they are, so its first token's logprobs are the float16-cache run's. (The decode
    kernels' accuracy over FP8 caches is checked against float64 in csrc/test_kv_fp8_ops.py; on
    this random model later tokens move chaotically with any rounding.)"""
    from vllm_volta import LLM

    save_tiny_model(tmp_path, "llama", hidden_size=256, intermediate_size=512, head_dim=64)
    prompts = random_prompts(12, 3, 40, seed=2)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    common = dict(skip_tokenizer_init=True, dtype="float16", gpu_memory_utilization=0.3, max_num_seqs=16,
                  enable_prefix_caching=False)

    def generate(**kwargs):
        llm = LLM(str(tmp_path), **common, **kwargs)
        runner = llm.llm_engine.executor.worker.model_runner
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        info = (runner.attn_backend.name, runner.graph_runner is not None, runner.kv_cache_block_bytes(),
                runner.kv_caches[0].dtype)
        del llm
        torch.cuda.empty_cache()
        return outs, info

    graphed, (backend, has_graphs, fp8_bytes, cache_dtype) = generate(kv_cache_dtype=kv)
    assert backend == "VOLTA_PAGED" and has_graphs and cache_dtype == FORMATS[kv]
    eager, _ = generate(kv_cache_dtype=kv, enforce_eager=True)
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    exact, (_, _, fp16_bytes, _) = generate()
    assert fp16_bytes == 2 * fp8_bytes
    for a, b in zip(exact, graphed):
        assert a.token_ids[0] == b.token_ids[0]
        assert abs(a.logprobs[0][a.token_ids[0]].logprob - b.logprobs[0][a.token_ids[0]].logprob) < 1e-3
