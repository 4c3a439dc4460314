from __future__ import annotations

import pytest

from vllm_volta.config import SchedulerConfig
from vllm_volta.core.request import RequestStatus
from vllm_volta.core.scheduler import Scheduler


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=32,
                   chunked=True, max_model_len=64, caching=True):
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, enable_chunked_prefill=chunked)
    return Scheduler(cfg, num_blocks, block_size, caching)


def run_step(sched, token=7):
    """One engine step with a fake model that always samples `token`."""
    out = sched.schedule()
    sampled = {s.req_id: [token] for s in out.scheduled if s.samples}
    sched.update_from_output(out, sampled)
    return out


def test_token_budget_chunked_prefill_and_decode(make_request):
    sched = make_scheduler(max_num_batched_tokens=16)
    long, short = make_request(range(40)), make_request(range(100, 105))
    sched.add_request(long)
    sched.add_request(short)
    out = run_step(sched)
    assert [(s.req_id, s.num_new_tokens) for s in out.scheduled] == [(long.request_id, 16)]
    assert out.total_num_scheduled_tokens == 16 and not out.scheduled[0].samples
    out = run_step(sched)
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(16, 16)]
    out = run_step(sched)  # last 8 tokens of `long`, then all 5 of `short`
    assert [(s.req_id, s.num_new_tokens) for s in out.scheduled] == [
        (long.request_id, 8), (short.request_id, 5)]
    assert all(s.samples for s in out.scheduled)
    assert long.output_token_ids == [7] and short.output_token_ids == [7]
    out = run_step(sched)  # both decode
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1]
    assert out.scheduled[0].block_ids == sched.kv_cache_manager.get_block_ids(long.request_id)


def test_chunked_prefill_disabled_waits_for_whole_prompt(make_request):
    sched = make_scheduler(max_num_batched_tokens=64, chunked=False)
    a, b = make_request(range(40)), make_request(range(100, 130))
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert [s.req_id for s in out.scheduled] == [a.request_id]
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_scheduler(max_num_batched_tokens=16, chunked=False)


def test_max_num_seqs(make_request):
    sched = make_scheduler(max_num_seqs=2)
    reqs = [make_request(range(i, i + 3)) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    out = run_step(sched)
    assert len(out.scheduled) == 2 and len(sched.waiting) == 2


def test_preemption_recompute_never_drops(make_request):
    # 6 usable blocks of 4 tokens; two requests that together need 8 blocks.
    sched = make_scheduler(num_blocks=7, max_num_batched_tokens=64)
    a = make_request(range(10), max_tokens=14, ignore_eos=True)
    b = make_request(range(50, 60), max_tokens=14, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    preempted, steps = set(), 0
    while sched.has_unfinished_requests():
        out = run_step(sched)
        preempted |= out.preempted_req_ids
        steps += 1
        assert steps < 200
        used = sum(len(v) for v in sched.kv_cache_manager.req_to_blocks.values())
        assert used <= 6
    assert b.request_id in preempted and b.num_preemptions >= 1
    assert a.num_preemptions == 0
    for r in (a, b):
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert r.output_token_ids == [7] * 14
    assert sched.kv_cache_manager.get_num_free_blocks() == 6


def test_preempted_request_requeued_at_front_and_blocks_freed(make_request):
    sched = make_scheduler(num_blocks=4, max_num_batched_tokens=64)  # 3 usable blocks
    a = make_request(range(4), max_tokens=20, ignore_eos=True)
    b = make_request(range(10, 14), max_tokens=20, ignore_eos=True)
    c = make_request(range(20, 22))
    for r in (a, b, c):
        sched.add_request(r)
    run_step(sched)  # a, b, c prefill: 3 blocks
    out = run_step(sched)  # a and b both need a new block: c then b get preempted
    assert c.request_id in out.preempted_req_ids
    assert list(sched.waiting)[0].status == RequestStatus.PREEMPTED
    assert all(r.num_computed_tokens == 0 for r in sched.waiting)
    assert all(r.request_id not in sched.kv_cache_manager.req_to_blocks for r in sched.waiting)


def test_request_that_can_never_fit_finishes_with_error(make_request):
    sched = make_scheduler(num_blocks=3, max_num_batched_tokens=64)  # 2 blocks = 8 tokens
    big, ok = make_request(range(9)), make_request(range(3), max_tokens=2)
    sched.add_request(big)
    sched.add_request(ok)
    out = run_step(sched)
    assert out.errored == [big] and big.status == RequestStatus.FINISHED_ERROR
    assert "KV-cache blocks" in big.error
    assert [s.req_id for s in out.scheduled] == [ok.request_id]
    # A request that grows past the cache while decoding errors out too, not a hang.
    grow = make_request(range(6), max_tokens=10, ignore_eos=True)
    sched.add_request(grow)
    errored = []
    for _ in range(20):
        errored += run_step(sched).errored
    assert grow in errored and not sched.has_unfinished_requests()
    assert grow.output_token_ids == [7, 7, 7]


def test_stop_conditions(make_request):
    sched = make_scheduler(max_model_len=12)
    eos = make_request(range(3), eos_token_id=7)
    min_tok = make_request(range(3), eos_token_id=7, min_tokens=2, max_tokens=5)
    ignore = make_request(range(3), eos_token_id=7, ignore_eos=True, max_tokens=3)
    stop_id = make_request(range(3), stop_token_ids=[7])
    capped = make_request(range(10), ignore_eos=True, max_tokens=10)
    for r in (eos, min_tok, ignore, stop_id, capped):
        sched.add_request(r)
    for _ in range(5):
        run_step(sched)
    assert eos.status == RequestStatus.FINISHED_STOPPED and eos.output_token_ids == [7]
    assert eos.stop_reason is None and eos.get_finish_reason() == "stop"
    assert min_tok.output_token_ids == [7, 7] and min_tok.status == RequestStatus.FINISHED_STOPPED
    assert ignore.output_token_ids == [7] * 3 and ignore.get_finish_reason() == "length"
    assert stop_id.stop_reason == 7 and stop_id.get_finish_reason() == "stop"
    assert capped.num_tokens == 12 and capped.get_finish_reason() == "length"


def test_abort_frees_blocks_and_reports_finished(make_request):
    sched = make_scheduler()
    a, b = make_request(range(9)), make_request(range(100, 105))
    sched.add_request(a)
    sched.add_request(b)
    run_step(sched)
    free_before = sched.kv_cache_manager.get_num_free_blocks()
    sched.finish_requests([a.request_id, "unknown"], RequestStatus.FINISHED_ABORTED)
    assert a.status == RequestStatus.FINISHED_ABORTED
    assert sched.kv_cache_manager.get_num_free_blocks() == free_before + 3
    out = sched.schedule()
    assert out.finished_req_ids == {a.request_id}
    assert [s.req_id for s in out.scheduled] == [b.request_id]
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(b)


def test_prefix_hit_is_scheduled_from_cached_tokens(make_request):
    sched = make_scheduler()
    a = make_request(range(13), max_tokens=1)
    sched.add_request(a)
    run_step(sched)
    assert not sched.has_unfinished_requests()
    b = make_request(list(range(12)) + [99])
    sched.add_request(b)
    out = sched.schedule()
    assert (out.scheduled[0].num_computed_tokens, out.scheduled[0].num_new_tokens) == (12, 1)
    assert b.num_cached_tokens == 12
    stats = sched.kv_cache_manager.prefix_cache_stats
    assert (stats.queries, stats.hits, stats.hit_requests) == (26, 12, 1)


def test_failed_admission_is_not_counted_as_a_lookup(make_request):
    sched = make_scheduler(num_blocks=4, max_num_batched_tokens=64)  # 3 usable blocks
    a = make_request(range(8), max_tokens=5, ignore_eos=True)
    b = make_request(range(100, 108))
    sched.add_request(a)
    sched.add_request(b)
    for _ in range(3):
        run_step(sched)  # b needs 2 blocks; a holds 2, then 3 of the 3
    assert b.status == RequestStatus.WAITING
    assert sched.kv_cache_manager.prefix_cache_stats.requests == 1


def test_failed_step_does_not_leave_prefix_hits(make_request):
    sched = make_scheduler()
    a = make_request(range(13))
    sched.add_request(a)
    out = sched.schedule()  # a's 3 full blocks are registered for prefix caching
    sched.step_failed(out)  # ... but the step never wrote their KV
    sched.finish_requests(a.request_id, RequestStatus.FINISHED_ABORTED)
    b = make_request(list(range(12)) + [99])
    assert sched.kv_cache_manager.get_computed_blocks(b) == ([], 0)
    # A step that fails mid-prefill keeps the blocks computed by earlier steps.
    c = make_request(range(40), max_tokens=2)
    sched.config.max_num_batched_tokens = 16
    sched.add_request(c)
    run_step(sched)  # tokens 0..15 computed: blocks 0..3 cached
    sched.step_failed(sched.schedule())  # tokens 16..31 failed
    hits, n = sched.kv_cache_manager.get_computed_blocks(make_request(range(40)))
    assert n == 16
