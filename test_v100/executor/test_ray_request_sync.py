"""Rank 0's copies of the requests (RayExecutor): whole once, then deltas; grammar matchers
as bitmask rows. No Ray needed: messages are pickled as Ray would."""
from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import VOCAB_SIZE
from vllm_volta.sampling_params import SamplingParams

GUIDED_REGEX = r"[a-c]{2}-[0-9]{3}"


def _step(reqs, finished=(), samples=None):
    from vllm_volta.core.scheduler import ScheduledRequest, SchedulerOutput
    scheduled = [ScheduledRequest.make(r, 1, r.num_tokens - 1, [0]) for r in reqs]
    for s, flag in zip(scheduled, samples or [True] * len(reqs)):
        s.samples = flag
    return SchedulerOutput(scheduled=scheduled, total_num_scheduled_tokens=len(reqs),
                           finished_req_ids=set(finished))


def _same_request(copy, original) -> None:
    skip = {"grammar", "_block_hashes"}
    assert {k: v for k, v in vars(copy).items() if k not in skip} == {
        k: v for k, v in vars(original).items() if k not in skip}


def test_rank_0_requests_follow_the_engines_by_deltas():
    """Each request goes whole once, then as deltas; rank 0's copy equals the engine's request
    after every step (pickled as Ray would), also across a finished id coming back, a token
    list that shrank, and a reset after a failed step. Deltas are far smaller than requests."""
    import pickle

    from vllm_volta.core.request import Request
    from vllm_volta.executor.ray_messages import RequestDelta
    from vllm_volta.executor.ray_request_sync import DriverScheduleEncoder, RankZeroRequests
    long = [Request(str(i), list(range(4, 1004)), SamplingParams(), max_tokens=50, block_size=16)
            for i in range(8)]
    encoder, rank0 = DriverScheduleEncoder(VOCAB_SIZE), RankZeroRequests()

    def send(out):
        wire = pickle.dumps(encoder.encode(out))
        got = rank0.decode(pickle.loads(wire))
        for s, t in zip(got.scheduled, out.scheduled):
            _same_request(s.request, t.request)
            assert (s.token_ids, s.num_computed_tokens) == (t.token_ids, t.num_computed_tokens)
        return got, len(wire)

    _, first = send(_step(long))
    for step in range(3):
        for r in long:
            r.append_output_token_ids([100 + step])
            r.num_computed_tokens = r.num_tokens - 1
        long[step].num_preemptions += 1  # any attribute the engine writes reaches rank 0
        got, later = send(_step(long))
        assert all(isinstance(s.request, Request) for s in got.scheduled)
    assert later * 20 < first, (first, later)
    assert isinstance(encoder.encode(_step(long[:1])).schedule.scheduled[0].request, RequestDelta)
    # A finished id comes back as a new request; another request's tokens shrink.
    again = Request("0", [7, 8, 9], SamplingParams(temperature=0.5), max_tokens=5, block_size=16)
    long[1].output_token_ids.pop()
    long[1].all_token_ids.pop()
    send(_step([again, long[1]], finished={"0"}))
    assert len(rank0) == 8
    send(_step([long[2]], finished={str(i) for i in range(3, 8)}))
    assert len(rank0) == 3
    encoder.reset()  # a failed step: rank 0 drops what it held, everything goes whole
    step = encoder.encode(_step([long[2]]))
    assert step.reset and isinstance(step.schedule.scheduled[0].request, Request)
    rank0.decode(pickle.loads(pickle.dumps(step)))
    assert len(rank0) == 1


def test_grammar_matchers_reach_rank_0_as_bitmask_rows():
    """xgrammar matchers do not pickle: rank 0 gets this step's allowed-token row of each
    sampling request instead (equal to what the matcher fills), the others none; the engine's
    requests keep their matchers."""
    import pickle

    import xgrammar as xgr

    from test_v100.worker.tiny_models import build_tokenizer
    from vllm_volta.core.request import Request
    from vllm_volta.executor.ray_messages import BitmaskRow
    from vllm_volta.executor.ray_request_sync import DriverScheduleEncoder, RankZeroRequests
    from vllm_volta.structured_output import fill_bitmask
    info = xgr.TokenizerInfo.from_huggingface(build_tokenizer(), vocab_size=VOCAB_SIZE)
    compiled = xgr.GrammarCompiler(info).compile_regex(GUIDED_REGEX)
    reqs = [Request(str(i), [5, 6, 7], SamplingParams(), max_tokens=4, block_size=16)
            for i in range(3)]
    reqs[0].grammar, reqs[1].grammar = xgr.GrammarMatcher(compiled), xgr.GrammarMatcher(compiled)
    encoder, rank0 = DriverScheduleEncoder(VOCAB_SIZE), RankZeroRequests()
    for _ in range(2):  # whole, then as deltas
        out = _step(reqs, samples=[True, False, True])
        with pytest.raises(Exception):
            pickle.dumps(out)
        got = rank0.decode(pickle.loads(pickle.dumps(encoder.encode(out))))
        row = got.scheduled[0].request.grammar
        assert isinstance(row, BitmaskRow)
        bitmask = torch.zeros(2, row.words.numel(), dtype=torch.int32)
        row.fill_next_token_bitmask(bitmask, 1)
        assert torch.equal(bitmask[1], fill_bitmask([reqs[0].grammar], VOCAB_SIZE)[0])
        assert [s.request.grammar for s in got.scheduled[1:]] == [None, None]
        assert isinstance(reqs[0].grammar, xgr.GrammarMatcher)  # the engine's, untouched
        # The engine accepts an allowed token: next step's row follows the matcher.
        words = fill_bitmask([reqs[0].grammar], VOCAB_SIZE)[0]
        token = next(t for t in range(VOCAB_SIZE) if (int(words[t // 32]) >> (t % 32)) & 1)
        assert reqs[0].grammar.accept_token(token)
        reqs[0].append_output_token_ids([token])
        assert not torch.equal(words, fill_bitmask([reqs[0].grammar], VOCAB_SIZE)[0])
