"""Request outputs with vLLM's names and fields: RequestOutput, CompletionOutput, Logprob."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Logprob:
    """Log-probability of one token; rank is 1-based (1 = most likely) in the raw distribution."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per generated token: the sampled token plus the top-k, keyed by token id.
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token; the first is None (nothing precedes it).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class RequestMetrics:
    """Timestamps (time.time() seconds) of a request's life, filled in by the engine."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_in_queue(self) -> float | None:
        """Seconds between arrival and first scheduling."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One generated sequence of a request (a request with n > 1 has n of them).

    finish_reason is None while generating, then "stop" (eos, stop token or stop string)
    or "length" (max_tokens / max_model_len); stop_reason is the stop string or stop token
    id that ended it, None for eos or length.
    """

    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """Whether this sequence has finished."""
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, "
                f"token_ids={self.token_ids}, cumulative_logprob={self.cumulative_logprob}, "
                f"logprobs={self.logprobs}, finish_reason={self.finish_reason}, "
                f"stop_reason={self.stop_reason})")


@dataclass
class RequestOutput:
    """Output of one request: its prompt and the (cumulative) state of each completion.

    `error` is set (and `finished` is True) when the request failed on its own, e.g. a
    prompt longer than max_model_len; the other requests of the batch are unaffected.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None
    num_cached_tokens: int | None = None
    embedding: list[float] | None = None  # embedding requests (PoolingParams), once finished

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, "
                f"prompt_logprobs={self.prompt_logprobs}, outputs={self.outputs}, "
                f"finished={self.finished}, metrics={self.metrics}, error={self.error!r}, "
                f"num_cached_tokens={self.num_cached_tokens})")


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """``LLM.embed``'s result for one prompt (vLLM's class): ``outputs.embedding``."""

    request_id: str
    outputs: EmbeddingOutput | None
    prompt_token_ids: list[int] | None
    finished: bool = True
    error: str | None = None
