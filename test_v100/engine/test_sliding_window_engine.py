"""Sliding-window models on KV-cache groups: greedy tokens against transformers with prompts and
outputs well past the window, blocks really returned, chunked prefill, preemption, and prefix
cache hits."""
from __future__ import annotations

import pytest
import torch

from test_v100.engine.test_llm_engine import make_engine, run, tokens
from test_v100.worker.tiny_models import hf_greedy, random_prompts, save_tiny_model
from vllm_volta.core.grouped_kv_cache_manager import GroupedKVCacheManager
from vllm_volta.sampling_params import SamplingParams

WINDOW = 8
NEW_TOKENS = 16
PARAMS = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
# Gemma 3 with two sliding layers to one full one (groups: full, sliding, sliding); Mistral and
# Phi-3 with a window in every layer (one sliding group).
ARCHS = {
    "gemma2": dict(sliding_window=WINDOW),
    "gemma3": dict(sliding_window=WINDOW, num_hidden_layers=3,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "mistral": dict(sliding_window=WINDOW),
    "phi3": dict(sliding_window=WINDOW),
}


def _save(path, arch: str, seed: int):
    if arch != "phi3":
        return save_tiny_model(path, arch, seed=seed, **ARCHS[arch])
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.Phi3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                  initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  tie_word_embeddings=False, **ARCHS[arch])
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (model dir, greedy(prompt) -> transformers' NEW_TOKENS tokens, memoized)."""
    out = {}
    for seed, arch in enumerate(ARCHS):
        path = tmp_path_factory.mktemp(f"sw_{arch}")
        out[arch] = (path, _memo_greedy(_save(path, arch, seed)))
    return out


def _memo_greedy(hf_model):
    cache: dict[tuple[int, ...], list[int]] = {}

    def greedy(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in cache:
            cache[key] = hf_greedy(hf_model, prompt, NEW_TOKENS)
        return cache[key]
    return greedy


def _prompts():
    return random_prompts(2, 25, 45, seed=4)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_past_the_window_matches_transformers(models, arch):
    """Blocks of 4 under a window of 8; a 16-token budget chunks the prompts past the window."""
    path, greedy = models[arch]
    engine = make_engine(path, block_size=4, max_num_batched_tokens=16)
    kv = engine.scheduler.kv_cache_manager
    assert isinstance(kv, GroupedKVCacheManager) and kv.layout.frees_blocks
    expected_groups = {"gemma2": 2, "gemma3": 3}.get(arch, 1)
    assert kv.num_groups == expected_groups
    prompts = _prompts()
    outs = run(engine, prompts, PARAMS)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == greedy(prompt)
    assert kv.get_num_free_blocks() == kv.num_usable_blocks


def test_sliding_groups_return_their_blocks_while_running(models):
    path, greedy = models["gemma3"]
    engine = make_engine(path, block_size=4)
    kv = engine.scheduler.kv_cache_manager
    prompt = random_prompts(1, 48, 48, seed=9)[0]
    engine.add_request("long", prompt, PARAMS)
    free_before = kv.get_num_free_blocks()
    out = None
    while engine.has_unfinished_requests():
        held = kv.num_held_blocks("long")
        tables = kv.get_group_block_ids("long")
        for out in engine.step():
            pass
    # Before the last step (63 tokens computed): the full group holds all 16 blocks, each
    # sliding group only the blocks of its window (tokens 56..63: 2, or 3 across a boundary).
    full, *sliding = tables
    assert len(full) == 16 and 0 not in full
    for ids in sliding:
        assert len(ids) == 16 and ids[:13] == [0] * 13 and 0 not in ids[14:]
    assert held <= 16 + 2 * 3 < 3 * 16
    assert list(out.outputs[0].token_ids) == greedy(prompt)
    assert kv.get_num_free_blocks() == free_before


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async-scheduling"])
def test_preemption_with_groups_gives_the_same_tokens(models, async_scheduling):
    """With async scheduling, blocks leave the window while the previous step is still running."""
    path, greedy = models["gemma2"]
    prompts = random_prompts(4, 20, 30, seed=7)
    reference = [greedy(p) for p in prompts]
    # 30 usable blocks: a request of up to 46 tokens holds 12 in the full group and up to 10 in
    # the sliding one (a 32-token step), so four of them preempt each other.
    engine = make_engine(path, block_size=4, num_gpu_blocks_override=31, max_num_batched_tokens=32,
                         async_scheduling=async_scheduling)
    outs = run(engine, prompts, PARAMS)
    assert engine.get_stats().num_preemptions_total > 0
    assert tokens(outs) == reference
    assert engine.get_stats().num_free_blocks == 30


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_prefix_cache_hits_keep_transformers_tokens(models, arch):
    """A repeated prompt adopts the full group's whole prefix and the sliding groups' last window
    (blocks the first request returned, still cached in the pool)."""
    path, greedy = models[arch]
    engine = make_engine(path, block_size=4)
    assert engine.scheduler.kv_cache_manager.enable_caching
    prompt = random_prompts(1, 33, 33, seed=11)[0]
    other = prompt[:21] + [5, 6, 7, 8, 9]
    first = run(engine, [prompt], PARAMS)
    second = run(engine, [prompt, other], PARAMS)
    assert [o.num_cached_tokens for o in first + second] == [0, 32, 20]
    assert tokens(first + second) == [greedy(p) for p in (prompt, prompt, other)]
    assert engine.get_stats().prefix_cache_hits_total == 52


def test_cache_sizing_and_profile_step_use_the_groups(models, capsys):
    """The cache is capped at what max_num_seqs requests of max_model_len can hold at once, counted
    over the groups (the sliding ones: their window and a step), and the log says so."""
    path, _ = models["gemma3"]
    engine = make_engine(path, block_size=4, max_num_seqs=2, max_model_len=256, max_num_batched_tokens=16,
                         cpu_kvcache_space=1.0)
    runner = engine.executor.worker.model_runner
    layout = runner.kv_cache_layout()
    # Full group: 64 blocks of 4; each sliding group: the window before a 16-token step + 16
    # tokens, 23 over at most 7 blocks.
    assert layout.blocks_per_request(256, 16) == 64 + 2 * 7
    assert engine.scheduler.kv_cache_manager.num_usable_blocks == 2 * 78
    assert "max concurrency for 256-token requests: 2.00x" in capsys.readouterr().out
    runner.profile_run()  # every group's table in the worst-case step's metadata


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_gemma3_groups_on_cuda_graphs_match_transformers(tmp_path, async_scheduling):
    """VOLTA_PAGED (heads of 64) in float32 with full and piecewise CUDA graphs: each group's
    tables and slots staged into the graphs' buffers; tokens equal transformers' and eager's."""
    from vllm_volta import LLM
    hf_model = save_tiny_model(tmp_path, "gemma3", hidden_size=256, intermediate_size=512, head_dim=64,
                               query_pre_attn_scalar=64, sliding_window=16, num_hidden_layers=3,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    prompts = random_prompts(8, 20, 90, seed=2)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    common = dict(skip_tokenizer_init=True, dtype="float32", gpu_memory_utilization=0.3, max_num_seqs=8,
                  max_num_batched_tokens=64, async_scheduling=async_scheduling)
    llm = LLM(str(tmp_path), **common)
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.attn_backend.name == "VOLTA_PAGED" and runner.kv_cache_layout().num_groups == 3
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert runner.graph_runner.num_replays > 0
    del llm
    eager = LLM(str(tmp_path), enforce_eager=True, **common).generate(prompts, params, use_tqdm=False)
    assert out == [o.outputs[0].token_ids for o in eager]
    assert out == [hf_greedy(hf_model, p, 40) for p in prompts]
