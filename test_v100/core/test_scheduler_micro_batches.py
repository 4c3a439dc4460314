"""The scheduler under pipeline parallelism: several micro-batches in flight, a request never in
two of them while its sampled token is on its way, each micro-batch its share of the running."""
from __future__ import annotations

from test_v100.core.test_scheduler import make_scheduler


def ids(out) -> list[str]:
    return [s.req_id for s in out.scheduled]


def test_requests_in_flight_wait_for_their_token(make_request):
    sched = make_scheduler()
    sched.num_micro_batches = 2
    reqs = [make_request(range(i * 10, i * 10 + 3), max_tokens=4) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    first = sched.schedule()  # four prefills (new requests are admitted whole)
    assert ids(first) == [r.request_id for r in reqs]
    assert ids(sched.schedule()) == []  # every request has its token in flight
    sched.update_from_output(first, {r.request_id: [5] for r in reqs})
    # Decoding: each micro-batch takes half of the running requests, the rest the next one.
    a = sched.schedule()
    b = sched.schedule()
    assert ids(a) == [r.request_id for r in reqs[:2]] and ids(b) == [r.request_id for r in reqs[2:]]
    assert [s.token_ids for s in a.scheduled + b.scheduled] == [[5]] * 4  # known, never pending
    assert ids(sched.schedule()) == []
    sched.update_from_output(a, {r.request_id: [6] for r in reqs[:2]})
    c = sched.schedule()
    assert ids(c) == [r.request_id for r in reqs[:2]]
    assert [s.num_computed_tokens for s in c.scheduled] == [4, 4]
    assert all(r.output_token_ids == [5, 6] for r in reqs[:2])
    assert all(r.output_token_ids == [5] for r in reqs[2:])


def test_prefill_chunks_pipeline_without_sampling(make_request):
    """A prompt longer than the token budget: its chunks run in consecutive micro-batches (each
    stage runs them in order), only the last one samples."""
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.num_micro_batches = 2
    long = make_request(range(20))
    sched.add_request(long)
    chunks = [sched.schedule() for _ in range(3)]
    assert [(s.num_computed_tokens, s.num_new_tokens, s.samples) for c in chunks for s in c.scheduled] == [
        (0, 8, False), (8, 8, False), (16, 4, True)]
    assert ids(sched.schedule()) == []


def test_one_micro_batch_takes_every_running_request(make_request):
    sched = make_scheduler()
    reqs = [make_request(range(i * 10, i * 10 + 3)) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    sched.update_from_output(out, {r.request_id: [5] for r in reqs})
    assert len(sched.schedule().scheduled) == 3
