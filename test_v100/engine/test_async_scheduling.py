"""Async scheduling (step n+1 scheduled while step n runs): same tokens as the synchronous
engine (itself checked against transformers in test_llm_engine.py) on CPU, for every stop
rule, sampling mode and abort (preemption: test_llm_engine.py, both modes)."""
from __future__ import annotations

import pytest

from test_v100.engine.test_llm_engine import make_engine, run, tiny, tokens  # noqa: F401
from test_v100.worker.tiny_models import random_prompts
from vllm_volta.core.scheduler import PENDING_TOKEN
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.sampling_params import SamplingParams


def both(path, prompts, params, **kwargs):
    """(synchronous outputs, async outputs, async engine) for the same workload."""
    sync = run(make_engine(path, **kwargs), prompts, params)
    engine = make_engine(path, async_scheduling=True, **kwargs)
    return sync, run(engine, prompts, params), engine


def finish(outputs):
    return [(o.outputs[0].finish_reason, o.outputs[0].stop_reason) for o in outputs]


def logprob_rows(rows):
    """Per position: token -> (logprob, rank); None rows (the first prompt token) kept."""
    return [d and {t: (round(lp.logprob, 4), lp.rank) for t, lp in d.items()} for d in rows]


def test_greedy_seeded_and_n_match_the_synchronous_engine(tiny):
    path, _ = tiny["llama"]
    prompts = random_prompts(7, 3, 40, seed=5)
    params = ([SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (1, 2, 9, 17)]
              + [SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True),
                 SamplingParams(temperature=1.0, top_k=20, seed=4, max_tokens=6, ignore_eos=True),
                 SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=7, ignore_eos=True,
                                logprobs=2)])
    # A small token budget mixes chunked prefills into the decode steps.
    sync, async_, _ = both(path, prompts, params, max_num_batched_tokens=24)
    for index in range(3):
        assert tokens(sync[-1:], index) == tokens(async_[-1:], index)
    assert tokens(sync) == tokens(async_)
    assert finish(sync) == finish(async_)
    assert [len(t) for t in tokens(async_)] == [1, 2, 9, 17, 12, 6, 7]
    assert logprob_rows(sync[-1].outputs[0].logprobs) == logprob_rows(async_[-1].outputs[0].logprobs)


def test_prompt_logprobs_over_chunked_prefill_match(tiny):
    path, _ = tiny["llama"]
    prompts = random_prompts(3, 20, 40, seed=9)
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=6, prompt_logprobs=2,
                            logprobs=1, ignore_eos=True)
    sync, async_, _ = both(path, prompts, params, max_num_batched_tokens=16)
    for a, b in zip(sync, async_):
        assert [list(o.token_ids) for o in a.outputs] == [list(o.token_ids) for o in b.outputs]
        assert len(b.prompt_logprobs) == len(b.prompt_token_ids)
        assert logprob_rows(a.prompt_logprobs) == logprob_rows(b.prompt_logprobs)


def test_stop_tokens_and_max_model_len_match(tiny):
    path, _ = tiny["qwen2"]
    prompts = random_prompts(4, 5, 30, seed=2)
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    first = tokens(run(make_engine(path), prompts, free))
    # Stop on a token each greedy continuation produces at a different step.
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                             stop_token_ids=[seq[i]]) for i, seq in zip((0, 3, 7, 12), first)]
    sync, async_, engine = both(path, prompts, params)
    assert tokens(sync) == tokens(async_)
    assert finish(async_) == finish(sync)
    assert all(reason == "stop" for reason, _ in finish(async_))
    # The context limit: a request ends by length exactly where the synchronous one does.
    long_prompt = random_prompts(1, 60, 60, seed=4)
    sync, async_, engine = both(path, long_prompt, free, max_model_len=70)
    assert tokens(async_) == tokens(sync) and len(tokens(async_)[0]) == 10
    assert engine.get_stats().num_free_blocks == engine.get_stats().num_total_blocks


def test_history_samplers_wait_for_the_token_in_flight(tiny):
    """Penalties and min_tokens read the output so far: those steps are not overlapped,
    and their tokens are still those of the synchronous engine."""
    path, _ = tiny["llama"]
    prompts = random_prompts(3, 6, 12, seed=6)
    params = [SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.5),
              SamplingParams(temperature=0, max_tokens=10, presence_penalty=1.0,
                             frequency_penalty=0.5),
              SamplingParams(temperature=0, max_tokens=10, min_tokens=6,
                             stop_token_ids=list(range(4, 300)))]
    sync, async_, _ = both(path, prompts, params)
    assert tokens(sync) == tokens(async_)
    assert len(tokens(async_)[2]) == 7  # min_tokens held the stop ids back for 6 tokens


def test_next_step_is_launched_before_the_tokens_are_applied(tiny):
    """The overlap is real: step n+1 goes to the executor with the tokens of step n still
    pending (PENDING_TOKEN inputs, filled on the device), and a step returns the outputs
    of the step before it."""
    path, _ = tiny["llama"]
    engine = make_engine(path, async_scheduling=True)
    seen = []
    launch = engine.executor.execute_model_async

    def spy(scheduler_output):
        seen.append([s.token_ids for s in scheduler_output.scheduled])
        return launch(scheduler_output)

    engine.executor.execute_model_async = spy
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert engine.step() == []  # prefill launched, nothing applied yet
    request = engine.scheduler.requests["a"]
    assert request.num_pending == 1 and request.output_token_ids == []
    outs = engine.step()  # decode launched on a pending token, then the prefill's applied
    assert seen[1] == [[PENDING_TOKEN]]
    assert [list(o.outputs[0].token_ids) for o in outs] == [request.output_token_ids]
    assert len(request.output_token_ids) == 1 and request.num_pending == 1
    while engine.has_unfinished_requests():
        engine.step()
    # max_tokens is known in advance: no fifth step runs (the last call only applies)
    assert [len(s) for s in seen] == [1, 1, 1, 1, 0]
    reference = tokens(run(make_engine(path), [[5, 6, 7]],
                           SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))
    assert request.output_token_ids == reference[0]


def test_abort_while_a_step_is_in_flight(tiny):
    path, _ = tiny["llama"]
    engine = make_engine(path, async_scheduling=True)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("gone", [5, 6, 7, 8], params)
    engine.add_request("kept", [9, 10, 11], params)
    for _ in range(3):
        engine.step()
    engine.abort_request("gone")
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            final[out.request_id] = out
    assert set(final) == {"kept"} and len(final["kept"].outputs[0].token_ids) == 30
    engine.step()  # the last step in flight is applied; its aborted row is dropped
    assert engine.get_stats().num_free_blocks == engine.get_stats().num_total_blocks
    reference = tokens(run(make_engine(path), [[9, 10, 11]], params))
    assert list(final["kept"].outputs[0].token_ids) == reference[0]


def test_a_finished_id_reused_by_a_one_token_prompt_gets_its_own_tokens(tiny):
    """Decode rows whose ids match the last step's sampled rows take those sampled ids as
    inputs in one copy; an id that finished and came back as a new request must not."""
    path, _ = tiny["llama"]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = tokens(run(make_engine(path), [[5, 6, 7]], greedy))[0]
    stop_at = next(i for i in range(1, 6) if first[i] not in first[:i])
    # A stop token is only seen once applied: by then the next step (with "a") is launched.
    engine = make_engine(path, async_scheduling=True)
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                      stop_token_ids=[first[stop_at]]))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert list(outputs[-1].outputs[0].token_ids) == first[:stop_at + 1]
    engine.add_request("a", [13], greedy)  # the same id, a one-token prompt
    while engine.has_unfinished_requests():
        outputs += engine.step()
    reference = tokens(run(make_engine(path), [[13]], greedy))[0]
    assert list(outputs[-1].outputs[0].token_ids) == reference
