"""The engine with hybrid models (Gated DeltaNet layers with a recurrent state per request, and
full attention): greedy tokens and logprobs against transformers, chunked prefill next to
decodes, batched equals alone, preemption and resume, n > 1, a failed step."""
from __future__ import annotations

import pytest
import torch

from test_v100.engine.test_llm_engine import make_engine, run, tokens
from test_v100.worker.tiny_models import hf_greedy, random_prompts, tiny_models
from vllm_volta.sampling_params import SamplingParams

HYBRID = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return tiny_models(tmp_path_factory, HYBRID)


@pytest.mark.parametrize("arch", HYBRID)
def test_greedy_matches_transformers_with_chunked_prefill(hybrid, arch):
    path, hf = hybrid[arch]
    prompts = [[5, 6, 7, 8], random_prompts(1, 20, 20, seed=1)[0], random_prompts(1, 45, 45)[0]]
    engine = make_engine(path, max_num_batched_tokens=16)  # chunked prefill next to decodes
    assert engine.scheduler.kv_cache_manager.has_state_slots
    assert not engine.scheduler.kv_cache_manager.enable_caching
    for prompt, out in zip(prompts, run(engine, prompts, GREEDY)):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 8)


def test_batched_equals_alone_and_slots_come_back(hybrid):
    path, _ = hybrid["qwen3_5"]
    prompts = random_prompts(12, 3, 30, seed=3)
    engine = make_engine(path, max_num_seqs=5, max_num_batched_tokens=40)
    batched = tokens(run(engine, prompts, GREEDY))
    alone = [tokens(run(engine, [p], GREEDY))[0] for p in prompts[:4]]
    assert batched[:4] == alone
    kv = engine.scheduler.kv_cache_manager
    assert kv._req_to_state_slot == {} and sorted(kv._free_state_slots) == [1, 2, 3, 4, 5]


def test_preempted_request_recomputes_its_state(hybrid):
    path, hf = hybrid["qwen3_5"]
    prompts = random_prompts(3, 20, 24, seed=4)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    # A cache of a few blocks: decodes of three requests preempt the last admitted ones.
    engine = make_engine(path, num_gpu_blocks_override=9, block_size=8, max_num_batched_tokens=64)
    outs = run(engine, prompts, params)
    assert engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 24)


def test_logprobs_and_n_samples(hybrid):
    path, hf = hybrid["qwen3_next"]
    prompt = random_prompts(1, 12, 12, seed=5)[0]
    engine = make_engine(path)
    out = run(engine, [prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2))[0]
    ids = list(out.outputs[0].token_ids)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt + ids])).logits[0].float(), -1)
    for j, (token, lp) in enumerate(zip(ids, out.outputs[0].logprobs)):
        torch.testing.assert_close(lp[token].logprob, ref[len(prompt) - 1 + j, token].item(), atol=1e-3, rtol=0)
    seeded = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    first, second = run(engine, [prompt], seeded)[0], run(engine, [prompt], seeded)[0]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in second.outputs]


def test_beam_search_and_structured_output(hybrid):
    """Beam search (each beam a request of its own, its state recomputed) against transformers'
    num_beams search; a regex-constrained request's output matches the regex."""
    import re

    from vllm_volta import LLM
    from vllm_volta.sampling_params import BeamSearchParams, StructuredOutputsParams

    path, hf = hybrid["qwen3_5"]
    llm = LLM(str(path), cpu_kvcache_space=0.01, max_model_len=64, skip_tokenizer_init=True, dtype="float32")
    prompt = random_prompts(1, 6, 6, seed=12)[0]
    out = llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), num_beams=2, num_return_sequences=2, do_sample=False,
                          max_new_tokens=4, min_new_tokens=4, eos_token_id=None, pad_token_id=0)
    assert [s.tokens for s in out.sequences] == ref.tolist()
    del llm

    from test_v100.worker.tiny_models import build_tokenizer
    build_tokenizer().save_pretrained(path)
    llm = LLM(str(path), cpu_kvcache_space=0.01, max_model_len=64, dtype="float32")
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=12,
                            structured_outputs=StructuredOutputsParams(regex=r"(yes|no) [0-9]{2}"))
    text = llm.generate(["Answer:"], params)[0].outputs[0].text
    assert re.fullmatch(r"(yes|no) [0-9]{2}", text), text


def test_max_num_seqs_is_capped_by_the_state_pool(hybrid, caplog):
    """A budget too small for max_num_seqs requests' states: the pool takes at most half of it and
    max_num_seqs is capped to the slots that fit (with a warning); requests still run right."""
    import logging

    from vllm_volta.logger import ROOT_LOGGER_NAME

    path, hf = hybrid["qwen3_5"]
    root = logging.getLogger(ROOT_LOGGER_NAME)  # it does not propagate to pytest's root handler
    root.addHandler(caplog.handler)
    try:
        engine = make_engine(path, cpu_kvcache_space=0.001, max_num_seqs=256)
    finally:
        root.removeHandler(caplog.handler)
    sc, cc = engine.vllm_config.scheduler_config, engine.vllm_config.cache_config
    assert 2 <= cc.num_state_slots < 257 and sc.max_num_seqs == cc.num_state_slots - 1
    assert engine.scheduler.config.max_num_seqs == sc.max_num_seqs
    assert "max_num_seqs capped from 256" in caplog.text
    kv = engine.scheduler.kv_cache_manager
    assert sorted(kv._free_state_slots) == list(range(1, cc.num_state_slots))
    prompt = random_prompts(1, 10, 10, seed=13)[0]
    assert tokens(run(engine, [prompt], GREEDY)) == [hf_greedy(hf, prompt, 8)]
