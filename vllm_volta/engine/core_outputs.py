"""Request outputs on the engine core's pipe: per request, only what is new since its last output.

The engine's RequestOutputs are cumulative (every token id and all text so far). Building and
pickling them whole each step costs the core, whose one thread also schedules and launches the
steps, time that grows with the output length. In the core, ``OutputEncoder.encode`` is the
engine's ``output_builder``: it reads each advanced request's state and makes plain tuples with
the token ids, text and logprobs added since the request's previous output; ``OutputDecoder``
(client side) appends them and rebuilds cumulative RequestOutputs, for the newest state of each
request only.

Wire item per request:
    (request_id, finished, error, num_cached_tokens, metrics fields or None,
     prompt_logprobs or None (sent when it grew), completions, embedding or None (an embedding request's, in its
     one item: it finishes at the step that computes it))
with one tuple per completion:
    (start, new_token_ids, new_text, cumulative_logprob, new_logprobs or None, finish_reason,
     stop_reason)
where ``start`` is how many of its token ids the client already has.
"""
from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from vllm_volta.outputs import CompletionOutput, RequestMetrics, RequestOutput

if TYPE_CHECKING:
    from vllm_volta.core.request_group import RequestGroup


class OutputEncoder:
    """Core side: what each request's client already holds."""

    def __init__(self) -> None:
        # request id -> [token ids sent per completion, prompt logprobs entries sent]
        self._sent: dict[str, list] = {}

    def encode(self, group: RequestGroup) -> tuple:
        """The wire item of a request that advanced this step."""
        rid = group.request_id
        sent = self._sent.get(rid)
        if sent is None:
            sent = self._sent[rid] = [[0] * len(group.seqs), 0]
        counts = sent[0]
        completions = []
        finished = True
        for i, seq in enumerate(group.seqs):
            req = seq.request
            ids = req.output_token_ids
            start = counts[i] if len(ids) >= counts[i] else 0
            counts[i] = len(ids)
            finish_reason = req.get_finish_reason()  # None while it runs
            finished = finished and finish_reason is not None
            text = (seq.detokenizer.get_next_output_text(finish_reason is not None, delta=True)
                    if seq.detokenizer is not None else "")
            completions.append((start, ids[start:], text, seq.cumulative_logprob,
                                None if seq.logprobs is None else seq.logprobs[start:],
                                finish_reason, req.stop_reason))
        if finished:
            group.stamp_finished()
        prompt_logprobs = None
        if group.prompt_logprobs and len(group.prompt_logprobs) != sent[1]:
            prompt_logprobs = list(group.prompt_logprobs)
            sent[1] = len(prompt_logprobs)
        first = group.seqs[0].request
        if finished:
            del self._sent[rid]
        return (rid, finished, group.error or first.error, max(first.num_cached_tokens, 0),
                tuple(vars(group.metrics).values()), prompt_logprobs, completions, group.embedding)

    def forget(self, request_ids: list[str]) -> None:
        """Aborted requests."""
        for rid in request_ids:
            self._sent.pop(rid, None)


class _RequestState:
    __slots__ = ("token_ids", "texts", "logprobs", "completions", "prompt_logprobs", "embedding", "fields")

    def __init__(self, n: int) -> None:
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.texts: list[str] = [""] * n
        self.logprobs: list[list[Any] | None] = [None] * n
        self.completions: list[tuple] = []
        self.prompt_logprobs: list[Any] | None = None
        self.embedding: list[float] | None = None
        self.fields: tuple = ()


class OutputDecoder:
    """Client side: applies wire items in order, then builds each touched request's newest
    cumulative RequestOutput once."""

    def __init__(self) -> None:
        self._states: dict[str, _RequestState] = {}

    def apply(self, wire: list[tuple], touched: dict[str, _RequestState],
              live: Container[str]) -> None:
        """Apply one step's items for the requests in ``live`` (an aborted request's outputs
        may still be on the pipe); ``touched`` collects the requests they advanced."""
        for rid, finished, error, num_cached, metrics, prompt_logprobs, completions, embedding in wire:
            state = self._states.get(rid)
            if state is None:
                if rid not in live:
                    continue
                state = self._states[rid] = _RequestState(len(completions))
            for i, (start, new_ids, new_text, _, new_logprobs, _, _) in enumerate(completions):
                state.texts[i] += new_text
                ids = state.token_ids[i]
                del ids[start:]
                ids.extend(new_ids)
                if new_logprobs is not None:
                    logprobs = state.logprobs[i] = state.logprobs[i] or []
                    del logprobs[start:]
                    logprobs.extend(new_logprobs)
            state.completions = completions
            if prompt_logprobs is not None:
                state.prompt_logprobs = prompt_logprobs
            if embedding is not None:
                state.embedding = embedding
            state.fields = (finished, error, num_cached, metrics)
            touched[rid] = state
            if finished:
                del self._states[rid]

    @staticmethod
    def build(rid: str, state: _RequestState) -> RequestOutput:
        """The request's cumulative output (prompt fields left None for the caller)."""
        finished, error, num_cached, metrics = state.fields
        outputs = [
            CompletionOutput(index=i, text=state.texts[i], token_ids=list(state.token_ids[i]),
                             cumulative_logprob=cumulative_logprob,
                             logprobs=_copy(state.logprobs[i]),
                             finish_reason=finish_reason, stop_reason=stop_reason)
            for i, (_, _, _, cumulative_logprob, _, finish_reason, stop_reason)
            in enumerate(state.completions)]
        return RequestOutput(
            request_id=rid, prompt=None, prompt_token_ids=None,
            prompt_logprobs=_copy(state.prompt_logprobs),
            outputs=outputs, finished=finished,
            metrics=None if metrics is None else RequestMetrics(*metrics),
            error=error, num_cached_tokens=num_cached, embedding=state.embedding)

    def forget(self, request_ids: list[str]) -> None:
        """Aborted requests."""
        for rid in request_ids:
            self._states.pop(rid, None)


def _copy(items: list[Any] | None) -> list[Any] | None:
    return None if items is None else list(items)
