"""Rank 0's copy of the engine's requests, kept in step by deltas.

Rank 0 samples, so its model runner reads the requests themselves (sampling params, output
tokens for penalties, grammar). In MultiprocExecutor it shares the engine's objects; a Ray actor
gets copies. Sending every request whole every step costs O(batch x sequence length) where a
delta is O(batch): a request goes whole once, then as its new output tokens and its other
attributes. (256 requests of 1000 tokens, pickled and unpickled on a shared 2-core development
machine: 1.5 MB and 48 ms whole, 74 kB and 7.5 ms as deltas, encoding and decoding included.)
Rank 0's copy then equals the engine's request in every attribute the runner can read.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.executor.ray_messages import DriverStep, RequestDelta, grammar_row

# Kept in step by appending (token lists), fixed for a request's life (checked by identity), or
# replaced per step (grammar); the block-hash cache is the engine's (derived, lazily extended).
_APPENDED = ("output_token_ids", "all_token_ids")
_FIXED = ("prompt_token_ids", "sampling_params", "pooling_params")
_NOT_IN_STATE = frozenset(_APPENDED + _FIXED + ("grammar", "_block_hashes"))


def _fixed(request: Request) -> tuple[int, int, int]:
    return id(request.prompt_token_ids), id(request.sampling_params), id(request.pooling_params)


class _Sent:
    """What rank 0 holds of one request: the engine's object and how much of it was sent."""

    __slots__ = ("request", "num_output", "fixed")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.num_output = len(request.output_token_ids)
        self.fixed = _fixed(request)


class DriverScheduleEncoder:
    """Engine side: turns each step's schedule into rank 0's DriverStep."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._sent: dict[str, _Sent] = {}
        self._reset = False

    def reset(self) -> None:
        """After a failed step: rank 0 may not hold what was sent; resend whole."""
        self._sent.clear()
        self._reset = True

    def encode(self, out: SchedulerOutput) -> DriverStep:
        for rid in out.finished_req_ids:
            self._sent.pop(rid, None)
        scheduled = [replace(s, request=self._request(s.request, s.samples))
                     for s in out.scheduled]
        errored = [self._whole(r, None) for r in out.errored]  # never scheduled again
        step = DriverStep(replace(out, scheduled=scheduled, errored=errored), self._reset)
        self._reset = False
        return step

    def _request(self, request: Request, samples: bool) -> Request | RequestDelta:
        row = grammar_row(request.grammar, samples, self.vocab_size)
        rid = request.request_id
        sent = self._sent.get(rid)
        n = len(request.output_token_ids)
        if (sent is None or sent.request is not request or n < sent.num_output
                or len(request.all_token_ids) != request.num_prompt_tokens + n
                or sent.fixed != _fixed(request)):
            self._sent[rid] = _Sent(request)
            return self._whole(request, row)
        new = request.output_token_ids[sent.num_output:]
        sent.num_output = n
        state = vars(request).copy()  # a C-level copy, then the few keys rank 0 keeps itself
        for key in _NOT_IN_STATE:
            state.pop(key, None)
        state["grammar"] = row
        return RequestDelta(rid, new, state)

    @staticmethod
    def _whole(request: Request, row: Any) -> Request:
        if request.grammar is None:
            return request
        copied = copy.copy(request)  # xgrammar matchers do not pickle
        copied.grammar = row
        return copied


class RankZeroRequests:
    """Actor side: rebuilds the schedule with rank 0's copies of the requests."""

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def decode(self, step: DriverStep) -> SchedulerOutput:
        out = step.schedule
        if step.reset:
            self._requests.clear()
        for rid in out.finished_req_ids:
            self._requests.pop(rid, None)
        for s in out.scheduled:
            sent = s.request
            if isinstance(sent, RequestDelta):
                request = self._requests[sent.request_id]
                request.output_token_ids.extend(sent.new_output_token_ids)
                request.all_token_ids.extend(sent.new_output_token_ids)
                vars(request).update(sent.state)
                s.request = request
            else:
                self._requests[sent.request_id] = sent
        return out
