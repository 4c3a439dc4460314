"""LLMEngine end to end on CPU with tiny random-weight models, checked against transformers."""
from __future__ import annotations

import itertools

import pytest
import torch

from test_v100.worker.tiny_models import ARCHS, hf_greedy, random_prompts, tiny_models
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
_ids = itertools.count()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> (model dir, HF model) for every tiny architecture."""
    return tiny_models(tmp_path_factory, ARCHS)


def make_engine(path, **kwargs) -> LLMEngine:
    kwargs.setdefault("cpu_kvcache_space", 0.01)
    kwargs.setdefault("skip_tokenizer_init", True)
    kwargs.setdefault("dtype", "float32")  # the references are fp32 ("auto" is fp16 on a GPU)
    return LLMEngine.from_engine_args(EngineArgs(model=str(path), **kwargs))


def run(engine: LLMEngine, prompts, params):
    """Add all prompts, step to completion; final outputs in input order."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [f"r{next(_ids)}" for _ in prompts]
    for rid, prompt, p in zip(ids, prompts, params):
        engine.add_request(rid, prompt, p)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[rid] for rid in ids]


def tokens(outputs, index=0):
    return [list(o.outputs[index].token_ids) for o in outputs]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(tiny, arch):
    path, hf_model = tiny[arch]
    prompts = [[5, 6, 7, 8], random_prompts(1, 20, 20, seed=1)[0], random_prompts(1, 45, 45)[0]]
    # A small token budget forces chunked prefill next to decodes.
    engine = make_engine(path, max_num_batched_tokens=16)
    outs = run(engine, prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf_model, prompt, 8)
        assert out.outputs[0].finish_reason == "length" and out.finished
        assert out.prompt_token_ids == prompt


def test_64_mixed_prompts_batched_equal_alone(tiny):
    path, _ = tiny["qwen2"]
    prompts = random_prompts(64, 1, 70, seed=3)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    engine = make_engine(path, max_num_seqs=24, max_num_batched_tokens=96,
                         enable_prefix_caching=False)
    batched = tokens(run(engine, prompts, params))
    alone = [tokens(run(engine, [p], params))[0] for p in prompts]
    assert batched == alone


def test_prefix_cache_hit_gives_identical_output(tiny):
    path, _ = tiny["llama"]
    shared = random_prompts(1, 40, 40, seed=5)[0]
    prompts = [shared + [10, 11, 12], shared + [20, 21]]
    reference = tokens(run(make_engine(path, enable_prefix_caching=False), prompts, GREEDY))
    engine = make_engine(path, block_size=8)
    first = run(engine, prompts[:1], GREEDY)
    before = engine.get_stats().prefix_cache_hits_total
    second = run(engine, prompts, GREEDY)  # both hit the 40 shared tokens (5 blocks)
    assert tokens(first) + tokens(second) == reference[:1] + reference
    assert engine.get_stats().prefix_cache_hits_total - before == 2 * 40
    assert [o.num_cached_tokens for o in second] == [40, 40]
    assert first[0].num_cached_tokens == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async-scheduling"])
def test_preempted_then_resumed_request_is_identical(tiny, async_scheduling):
    """With async scheduling, requests are also preempted with a token in flight."""
    path, _ = tiny["llama"]
    prompts = random_prompts(6, 8, 20, seed=7)
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)] * 5 + [
        SamplingParams(temperature=1.0, seed=11, max_tokens=24, ignore_eos=True)]
    reference = tokens(run(make_engine(path), prompts, params))
    # 24 usable blocks of 4 tokens: not enough for 6 requests of up to 44 tokens each.
    engine = make_engine(path, block_size=4, num_gpu_blocks_override=25,
                         async_scheduling=async_scheduling)
    outs = run(engine, prompts, params)
    assert engine.get_stats().num_preemptions_total > 0
    assert tokens(outs) == reference
    assert engine.get_stats().num_free_blocks == 24


def test_request_too_big_for_the_cache_errors_alone(tiny):
    path, _ = tiny["llama"]
    engine = make_engine(path, block_size=4, num_gpu_blocks_override=5)  # 16 tokens
    outs = run(engine, [list(range(4, 24)), [5, 6, 7]],
               SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert outs[0].error and "KV-cache blocks" in outs[0].error
    assert outs[0].outputs[0].finish_reason == "error"
    assert outs[1].error is None and len(outs[1].outputs[0].token_ids) == 4


def test_seeded_sampling_is_reproducible(tiny):
    path, _ = tiny["qwen3"]
    prompt = [7, 8, 9, 10]
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    engine = make_engine(path)
    alone = tokens(run(engine, [prompt], seeded))[0]
    others = random_prompts(5, 3, 30, seed=9)
    mixed = run(engine, others + [prompt], [SamplingParams(temperature=0.8, max_tokens=12)] * 5
                + [seeded])
    assert tokens(mixed)[-1] == alone
    other_seed = SamplingParams(temperature=1.0, seed=4321, max_tokens=12, ignore_eos=True)
    assert tokens(run(engine, [prompt], other_seed))[0] != alone
    # n > 1: children differ from each other, and reproduce as a group.
    n3 = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    first, again = run(engine, [prompt], n3)[0], run(engine, [prompt], n3)[0]
    children = [list(c.token_ids) for c in first.outputs]
    assert children == [list(c.token_ids) for c in again.outputs]
    assert len({tuple(c) for c in children}) == 3
    # Child 0 is seeded by the request's seed itself, like an n=1 request.
    n1 = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    assert children[0] == tokens(run(engine, [prompt], n1))[0]


def test_too_long_prompt_is_rejected_and_engine_continues(tiny):
    path, hf_model = tiny["llama"]
    engine = make_engine(path, max_model_len=32)
    with pytest.raises(ValueError, match=r"prompt length 33 exceeds max_model_len 32"):
        engine.add_request("long", list(range(4, 37)), GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("empty", [], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("oov", [1, 10_000], GREEDY)
    with pytest.raises(ValueError, match="token id -1 is outside"):
        engine.add_request("negative", [1, -1, 10_000], GREEDY)
    for bad in ([1, True], [1, 2.0], [1, "2"]):
        with pytest.raises(ValueError, match="prompt must be a string, a list of token ids"):
            engine.add_request("bad-type", bad, GREEDY)
    assert not engine.has_unfinished_requests()
    out = run(engine, [[5, 6, 7]], GREEDY)[0]
    assert list(out.outputs[0].token_ids) == hf_greedy(hf_model, [5, 6, 7], 8)
    # A prompt that fills max_model_len is capped by it.
    capped = run(engine, [list(range(4, 34))], GREEDY)[0]
    assert len(capped.outputs[0].token_ids) == 2 and capped.outputs[0].finish_reason == "length"


def test_stop_token_ids_min_tokens_and_eos(tiny):
    path, hf_model = tiny["mistral"]
    prompt = [5, 6, 7, 8]
    expected = hf_greedy(hf_model, prompt, 8)
    engine = make_engine(path)
    stop_id = expected[3]
    first = expected.index(stop_id)
    out = run(engine, [prompt], SamplingParams(temperature=0, max_tokens=8,
                                               stop_token_ids=[stop_id]))[0].outputs[0]
    assert list(out.token_ids) == expected[:first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    later = run(engine, [prompt], SamplingParams(temperature=0, max_tokens=8, min_tokens=first + 1,
                                                 stop_token_ids=[stop_id]))[0].outputs[0]
    assert stop_id not in later.token_ids[:first + 1]


def test_logprobs_match_transformers(tiny):
    path, hf_model = tiny["qwen2"]
    prompt = random_prompts(1, 12, 12, seed=4)[0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3,
                            prompt_logprobs=2)
    out = run(make_engine(path, max_num_batched_tokens=8), [prompt], params)[0]
    ids = prompt + list(out.outputs[0].token_ids)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    comp = out.outputs[0]
    assert len(comp.logprobs) == 4
    total = 0.0
    for step, entry in enumerate(comp.logprobs):
        row = ref[len(prompt) - 1 + step]
        token = ids[len(prompt) + step]
        assert entry[token].rank == 1
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        top3 = row.topk(3).indices.tolist()
        assert set(top3) <= set(entry) and len(entry) == 3
        total += row[token].item()
    assert comp.cumulative_logprob == pytest.approx(total, abs=1e-3)
    plp = out.prompt_logprobs
    assert len(plp) == len(prompt) and plp[0] is None
    for pos in range(1, len(prompt)):
        row = ref[pos - 1]
        token = prompt[pos]
        assert plp[pos][token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert plp[pos][token].rank == int((row > row[token]).sum()) + 1


def test_abort_frees_blocks_and_stats(tiny):
    path, _ = tiny["llama"]
    engine = make_engine(path)
    total = engine.get_stats().num_free_blocks
    engine.add_request("a", list(range(4, 60)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", [5, 6], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    stats = engine.get_stats()
    assert stats.num_running == 2 and stats.num_free_blocks < total and stats.kv_cache_usage > 0
    assert stats.prompt_tokens_total == 58 and stats.generation_tokens_total == 2
    engine.abort_request(["a", "b", "missing"])
    assert not engine.has_unfinished_requests()
    assert engine.get_stats().num_free_blocks == total and engine.step() == []
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("c", [5], GREEDY)
        engine.add_request("c", [5], GREEDY)


def test_failed_step_leaves_no_stale_prefix_cache(tiny):
    from vllm_volta.executor.uniproc import UniProcExecutor

    class FailOnce(UniProcExecutor):
        fail = True

        def execute_model_async(self, scheduler_output):
            if FailOnce.fail and scheduler_output.scheduled:
                FailOnce.fail = False
                raise RuntimeError("injected failure")
            return super().execute_model_async(scheduler_output)

    path, hf_model = tiny["llama"]
    engine = LLMEngine(EngineArgs(model=str(path), skip_tokenizer_init=True,
                                  cpu_kvcache_space=0.01).create_engine_config(),
                       executor_class=FailOnce)
    prompt = random_prompts(1, 40, 40, seed=8)[0]
    engine.add_request("x", prompt, GREEDY)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    engine.abort_request("x")
    out = run(engine, [prompt], GREEDY)[0]
    assert out.num_cached_tokens == 0
    assert list(out.outputs[0].token_ids) == hf_greedy(hf_model, prompt, 8)


def test_engine_raises_the_gc_young_threshold(tiny):
    import gc

    from vllm_volta.engine.gc_policy import GC_YOUNG_THRESHOLD

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        engine = make_engine(tiny["llama"][0])
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
        engine.shutdown()
    finally:
        gc.set_threshold(*saved)


def test_engine_freezes_its_startup_heap_until_the_last_engine_shuts_down(tiny, monkeypatch):
    import gc

    from vllm_volta.engine import gc_policy

    gc.unfreeze()  # engines other tests left open hold a freeze: start from none
    monkeypatch.setattr(gc_policy, "_engines_holding_freeze", 0)

    def collectable(obj) -> bool:  # gc.get_objects() leaves out the frozen heap
        return any(o is obj for o in gc.get_objects())

    marker = [object()]  # a tracked container older than the engines
    assert collectable(marker)
    first = make_engine(tiny["llama"][0])
    assert not collectable(marker)
    second = make_engine(tiny["llama"][0])
    second.shutdown()
    assert not collectable(marker)  # `first` still runs
    first.shutdown()
    first.shutdown()  # a second shutdown releases nothing more
    assert collectable(marker)
    assert gc_policy._engines_holding_freeze == 0


def _hf_generate(model, prompt, max_new_tokens, **kwargs):
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                              eos_token_id=None, bos_token_id=None, pad_token_id=0,
                              **kwargs.pop("config", {}))
    saved, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), generation_config=config, **kwargs)
    finally:
        model.generation_config.eos_token_id = saved
    return out[0, len(prompt):].tolist()


def test_logit_bias_and_allowed_token_ids_match_transformers(tiny):
    """Greedy with logit_bias = transformers' sequence_bias on single tokens; with
    allowed_token_ids = transformers' prefix_allowed_tokens_fn; in one batch with a plain row."""
    path, hf_model = tiny["llama"]
    prompts = random_prompts(3, 5, 20, seed=9)
    plain = hf_greedy(hf_model, prompts[0], 8)
    bias = {plain[0]: -4.0, plain[1]: -4.0, 17: 3.0}
    allowed = [9, 33, 101, 250]
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias=bias),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, allowed_token_ids=allowed),
              GREEDY]
    outs = tokens(run(make_engine(path), prompts, params))
    want_bias = _hf_generate(hf_model, prompts[0], 8,
                             config={"sequence_bias": [[[t], b] for t, b in bias.items()]})
    assert want_bias != plain  # the bias changes what greedy picks
    assert outs[0] == want_bias
    assert outs[1] == _hf_generate(hf_model, prompts[1], 8, prefix_allowed_tokens_fn=lambda *_: allowed)
    assert outs[2] == hf_greedy(hf_model, prompts[2], 8)


def test_token_ids_outside_the_vocabulary_are_refused(tiny):
    path, _ = tiny["llama"]
    engine = make_engine(path)
    for kwargs, name in (({"logit_bias": {10_000: 1.0}}, "logit_bias"),
                         ({"allowed_token_ids": [3, 10_000]}, "allowed_token_ids")):
        with pytest.raises(ValueError, match=f"{name}: token id 10000 is outside the vocabulary"):
            engine.add_request("bad", [5, 6], SamplingParams(**kwargs))
    assert not engine.has_unfinished_requests()
