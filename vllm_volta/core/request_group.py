"""A user request and its n sequences: detokenization, logprobs and RequestOutput."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vllm_volta.core.request import Request, RequestStatus
from vllm_volta.engine.detokenizer import IncrementalDetokenizer
from vllm_volta.outputs import (CompletionOutput, Logprob, RequestMetrics, RequestOutput)
from vllm_volta.sample.logprobs import make_logprobs_dict
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.worker.model_runner import LogprobsRow, PromptLogprobsChunk


class _Sequence:
    """Output-side state of one child sequence."""

    def __init__(self, request: Request, tokenizer: Any, params: SamplingParams) -> None:
        self.request = request
        self.detokenizer = (IncrementalDetokenizer(tokenizer, request.prompt_token_ids, params)
                            if tokenizer is not None and params.detokenize else None)
        self.logprobs: list[dict[int, Logprob]] | None = (
            [] if params.logprobs is not None else None)
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None


class RequestGroup:
    """Everything the engine reports for one request_id (n child sequences)."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, children: list[Request], tokenizer: Any,
                 decode_token: Callable[[int], str] | None, arrival_time: float) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.seqs = [_Sequence(child, tokenizer, params) for child in children]
        self._by_id = {child.request_id: seq for child, seq in zip(children, self.seqs)}
        self._decode_token = decode_token
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.error: str | None = None
        self.embedding: list[float] | None = None  # an embedding request's, once computed

    @property
    def finished(self) -> bool:
        return all(seq.request.is_finished for seq in self.seqs)

    def child_ids(self) -> list[str]:
        return list(self._by_id)

    def mark_scheduled(self, now: float) -> None:
        if self.metrics.first_scheduled_time is None:
            self.metrics.first_scheduled_time = now

    def process_tokens(self, child: Request, num_new: int, logprobs: LogprobsRow | None,
                       now: float | None = None) -> str | None:
        """Account the child's `num_new` newest tokens; returns a stop string it hit.

        `now` is the token time (the engine passes one per step: a clock read per request
        per step is measurable host time)."""
        seq = self._by_id[child.request_id]
        if now is None:
            now = time.time()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.last_token_time = now
        if logprobs is not None and seq.logprobs is not None:
            ids, lps, rank = logprobs
            seq.logprobs.append(make_logprobs_dict(ids, lps, rank, self.params.logprobs,
                                                   self._decode_token))
            seq.cumulative_logprob += lps[0]
        if seq.detokenizer is None:
            return None
        new_ids = child.output_token_ids[-num_new:]
        # Stopped already means eos / a stop token id (stop strings are found below): that
        # token's own text is not part of the output (vLLM), unless asked for.
        if (child.status == RequestStatus.FINISHED_STOPPED
                and not self.params.include_stop_str_in_output):
            new_ids = new_ids[:-1]
        return seq.detokenizer.update(new_ids)

    def add_prompt_logprobs(self, chunk: PromptLogprobsChunk) -> None:
        """Append prompt logprobs of a prefill chunk (chunks recomputed after a preemption
        repeat positions already recorded; those are skipped)."""
        if self.prompt_logprobs is None:
            return
        for j, rank in enumerate(chunk.ranks):
            position = chunk.start + 1 + j  # the prompt token this row predicts
            if position < len(self.prompt_logprobs):
                continue
            self.prompt_logprobs.append(make_logprobs_dict(
                chunk.token_ids[j], chunk.logprobs[j], rank, self.params.prompt_logprobs,
                self._decode_token))

    def fail(self, error: str) -> None:
        self.error = error

    def stamp_finished(self) -> bool:
        """Whether every sequence finished; the first call that says so stamps the time."""
        finished = self.finished
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.time()
        return finished

    def make_output(self) -> RequestOutput:
        """The cumulative RequestOutput (vLLM's offline/streaming "cumulative" kind)."""
        finished = self.stamp_finished()
        outputs = []
        for index, seq in enumerate(self.seqs):
            req = seq.request
            seq_finished = req.is_finished
            text = (seq.detokenizer.get_next_output_text(seq_finished, delta=False)
                    if seq.detokenizer is not None else "")
            outputs.append(CompletionOutput(
                index=index, text=text, token_ids=list(req.output_token_ids),
                cumulative_logprob=seq.cumulative_logprob,
                logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                finish_reason=req.get_finish_reason() if seq_finished else None,
                stop_reason=req.stop_reason))
        first = self.seqs[0].request
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=list(self.prompt_logprobs) if self.prompt_logprobs else None,
            outputs=outputs, finished=finished, metrics=self.metrics,
            error=self.error or first.error, num_cached_tokens=max(first.num_cached_tokens, 0),
            embedding=self.embedding)
