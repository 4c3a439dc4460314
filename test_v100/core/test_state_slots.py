"""Recurrent-state slots (hybrid models): one per running request, taken at admission and
returned at finish, abort and preemption; a failed step restarts the request from an empty state."""
from __future__ import annotations

from vllm_volta.config import SchedulerConfig
from vllm_volta.core.request import RequestStatus
from vllm_volta.core.scheduler import Scheduler


def make_scheduler(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64):
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=64)
    return Scheduler(cfg, num_blocks, 4, False, num_state_slots=max_num_seqs + 1)


def run_step(sched, token=7):
    out = sched.schedule()
    sched.update_from_output(out, {s.req_id: [token] for s in out.scheduled if s.samples})
    return out


def slots_in_use(sched) -> dict[str, int]:
    return dict(sched.kv_cache_manager._req_to_state_slot)


def test_each_running_request_has_its_own_slot_never_the_scratch_one(make_request):
    sched = make_scheduler(max_num_seqs=3)
    reqs = [make_request(range(i, i + 5), max_tokens=3, ignore_eos=True) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    seen: dict[str, int] = {}
    while sched.has_unfinished_requests():
        out = run_step(sched)
        slots = [s.state_slot for s in out.scheduled]
        assert len(set(slots)) == len(slots) and all(1 <= s <= 3 for s in slots)
        for s in out.scheduled:  # a request keeps its slot while it runs
            assert seen.setdefault(s.req_id, s.state_slot) == s.state_slot
    assert slots_in_use(sched) == {}
    assert sorted(sched.kv_cache_manager._free_state_slots) == [1, 2, 3]


def test_abort_and_preemption_return_the_slot(make_request):
    sched = make_scheduler(num_blocks=5, max_num_batched_tokens=64)  # 4 usable blocks
    a = make_request(range(4), max_tokens=20, ignore_eos=True)
    b = make_request(range(10, 14), max_tokens=20, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    run_step(sched)
    assert set(slots_in_use(sched)) == {a.request_id, b.request_id}
    for _ in range(8):
        if b.request_id in run_step(sched).preempted_req_ids:
            break
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert set(slots_in_use(sched)) == {a.request_id}
    sched.finish_requests([a.request_id, b.request_id], RequestStatus.FINISHED_ABORTED)
    assert slots_in_use(sched) == {}
    assert len(sched.kv_cache_manager._free_state_slots) == 4


def test_failed_step_restarts_hybrid_requests_from_an_empty_state(make_request):
    sched = make_scheduler(max_num_batched_tokens=8)
    a = make_request(range(20), max_tokens=2)
    sched.add_request(a)
    run_step(sched)  # 8 of 20 prompt tokens computed
    assert a.num_computed_tokens == 8
    sched.step_failed(sched.schedule())  # tokens 8..15: their state update may be half done
    assert a.num_computed_tokens == 0
    out = sched.schedule()
    assert out.scheduled[0].num_computed_tokens == 0 and out.scheduled[0].state_slot >= 1


def test_models_without_state_get_no_slot(make_request):
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    sched = Scheduler(cfg, 16, 4, True)
    sched.add_request(make_request(range(6)))
    assert [s.state_slot for s in sched.schedule().scheduled] == [-1]
