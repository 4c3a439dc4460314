"""Chunked-prefill policy: vLLM's long_prefill_token_threshold / partial-prefill limits and the
attention cost cap beside running decodes, checked against brute-force references."""
from __future__ import annotations

import argparse

import pytest

from vllm_volta.config import SchedulerConfig
from vllm_volta.core.chunk_policy import attention_work, max_tokens_within
from vllm_volta.core.scheduler import Scheduler
from vllm_volta.engine.arg_utils import EngineArgs


def make_scheduler(budget=32, max_model_len=256, num_blocks=128, **policy):
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=max_model_len,
                          **policy)
    return Scheduler(cfg, num_blocks, 4, False)


def run_step(sched, token=7):
    out = sched.schedule()
    sched.update_from_output(out, {s.req_id: [token] for s in out.scheduled if s.samples})
    return out


def chunks(out):
    return {s.req_id: s.num_new_tokens for s in out.scheduled}


def brute_max_tokens(work, context):
    """Largest t >= 1 with t * (context + t / 2) <= work, by counting up."""
    t = 1
    while (t + 1) * (context + (t + 1) / 2) <= work:
        t += 1
    return t


@pytest.mark.parametrize("work,context", [(64, 0), (64, 7), (1000, 100), (5, 50), (2048 * 1024, 32000),
                                          (10**6, 0), (3, 0)])
def test_max_tokens_within_matches_brute_force(work, context):
    t = max_tokens_within(work, context)
    assert t == brute_max_tokens(work, context)
    assert t == 1 or attention_work(t, context) <= work


def test_threshold_caps_long_prompt_chunks(make_request):
    sched = make_scheduler(budget=32, long_prefill_token_threshold=12, prefill_attention_reference_len=0)
    long = make_request(range(40), max_tokens=2)
    sched.add_request(long)
    sizes = []
    while long.num_computed_tokens < 40:
        sizes.append(chunks(run_step(sched))[long.request_id])
    assert sizes == [12, 12, 12, 4]
    # A prompt within the threshold runs whole.
    short = make_request(range(100, 110), max_tokens=2)
    sched.add_request(short)
    assert chunks(run_step(sched))[short.request_id] == 10


def _decode_stream(sched, make_request):
    stream = make_request(range(500, 504), max_tokens=200)
    sched.add_request(stream)
    run_step(sched)  # its prompt; from now on it decodes
    return stream


def test_cost_cap_beside_decodes_and_no_starvation(make_request):
    budget, ref = 32, 2
    sched = make_scheduler(budget=budget, prefill_attention_reference_len=ref)
    stream = _decode_stream(sched, make_request)
    long = make_request(range(1000, 1200), max_tokens=1)
    sched.add_request(long)
    steps = 0
    while long.request_id in sched.requests:
        context = long.num_computed_tokens
        out = run_step(sched)
        steps += 1
        sizes = chunks(out)
        assert sizes[stream.request_id] == 1  # the decode runs every step
        expected = min(200 - context, budget - 1, brute_max_tokens(budget * ref, context))
        assert sizes[long.request_id] == expected, (context, sizes)
        assert steps < 1000
    assert long.output_token_ids == [7]  # finished: prefilled and sampled
    # Uncapped it would take ceil(200 / 31) = 7 steps; the cap trades steps for small chunks.
    assert steps > 7


def test_prefill_alone_keeps_full_chunks(make_request):
    sched = make_scheduler(budget=32, prefill_attention_reference_len=2)
    long = make_request(range(1000, 1200), max_tokens=1)
    sched.add_request(long)
    sizes = []
    while long.request_id in sched.requests:
        sizes.append(chunks(run_step(sched))[long.request_id])
    assert sizes == [32] * 6 + [8]


def test_cost_cap_off_fills_the_budget(make_request):
    sched = make_scheduler(budget=32, prefill_attention_reference_len=0)
    stream = _decode_stream(sched, make_request)
    long = make_request(range(1000, 1200), max_tokens=1)
    sched.add_request(long)
    out = run_step(sched)
    out = run_step(sched)
    assert chunks(out) == {stream.request_id: 1, long.request_id: 31}


def test_decodes_behind_a_running_prefill_keep_their_token(make_request):
    sched = make_scheduler(budget=10, long_prefill_token_threshold=8, prefill_attention_reference_len=0)
    long, short = make_request(range(40), max_tokens=4), make_request(range(100, 102), max_tokens=4)
    sched.add_request(long)
    sched.add_request(short)
    assert chunks(run_step(sched)) == {long.request_id: 8, short.request_id: 2}
    # Without the threshold the prefill ahead of the decode in the queue would take the whole
    # budget; one token stays with the decode.
    sched.chunk_policy.threshold = 0
    assert chunks(run_step(sched)) == {long.request_id: 9, short.request_id: 1}


def test_partial_prefill_limits(make_request):
    # One partial prefill at a time (vLLM's default): the second long prompt waits, a short
    # prompt behind it that fits whole goes first.
    sched = make_scheduler(budget=32, long_prefill_token_threshold=8, prefill_attention_reference_len=0)
    a, b, s = (make_request(range(20)), make_request(range(100, 120)), make_request(range(200, 206)))
    for r in (a, b, s):
        sched.add_request(r)
    assert chunks(run_step(sched)) == {a.request_id: 8, s.request_id: 6}
    # Two partial prefills, one long: same; two long: both progress.
    for max_long, expected in ((1, {"a": 8, "s": 6}), (2, {"a": 8, "b": 8, "s": 6})):
        sched = make_scheduler(budget=32, long_prefill_token_threshold=8, max_num_partial_prefills=2,
                               max_long_partial_prefills=max_long, prefill_attention_reference_len=0)
        reqs = {k: make_request(p, request_id=f"{k}-{max_long}")
                for k, p in (("a", range(20)), ("b", range(100, 120)), ("s", range(200, 206)))}
        for r in reqs.values():
            sched.add_request(r)
        got = chunks(run_step(sched))
        assert got == {reqs[k].request_id: n for k, n in expected.items()}


@pytest.mark.parametrize("kwargs,field", [
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
    ({"long_prefill_token_threshold": 300}, "long_prefill_token_threshold"),
    ({"max_num_partial_prefills": 0}, "max_num_partial_prefills"),
    ({"max_num_partial_prefills": 2, "max_long_partial_prefills": 3}, "max_long_partial_prefills"),
    ({"max_num_partial_prefills": 2, "enable_chunked_prefill": False, "max_num_batched_tokens": 256},
     "max_num_partial_prefills"),
    ({"prefill_attention_reference_len": -5}, "prefill_attention_reference_len"),
    ({"prefill_attention_reference_len": 1.5}, "prefill_attention_reference_len"),
])
def test_validation_names_the_field(kwargs, field):
    base = {"max_num_batched_tokens": 32, "max_model_len": 256}
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{**base, **kwargs})


def test_vllm_default_threshold_with_several_partial_prefills():
    assert SchedulerConfig(max_model_len=1000).long_prefill_token_threshold == 0
    cfg = SchedulerConfig(max_model_len=1000, max_num_partial_prefills=4, max_long_partial_prefills=2)
    assert cfg.long_prefill_token_threshold == 40  # 4% of max_model_len


def test_cli_flags_reach_engine_args():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--long-prefill-token-threshold", "256", "--max-num-partial-prefills", "3",
                              "--max-long-partial-prefills", "2", "--prefill-attention-reference-len", "0"])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.long_prefill_token_threshold, engine_args.max_num_partial_prefills,
            engine_args.max_long_partial_prefills, engine_args.prefill_attention_reference_len) == (256, 3, 2, 0)
    defaults = EngineArgs.from_cli_args(parser.parse_args([]))
    assert defaults.prefill_attention_reference_len == 1024 and defaults.long_prefill_token_threshold == 0
