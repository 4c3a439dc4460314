"""One sequence the scheduler runs: its tokens, progress and status."""
from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any

from vllm_volta.core.block_hash import BlockHash, hash_blocks

if TYPE_CHECKING:
    from vllm_volta.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request. Everything after PREEMPTED is finished."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finish_reason(status: RequestStatus) -> str | None:
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """A single sequence: prompt + generated tokens, and how much of it has KV.

    `num_computed_tokens` counts tokens whose KV is in the cache; the tokens still to
    run are `all_token_ids[num_computed_tokens:]`. Full-block hashes (for prefix
    caching) are computed when first asked for (`block_hashes`): adding a request costs no
    hashing, so an offline batch of prompts reaches the GPU sooner, and a waiting request is
    hashed when the scheduler looks it up, while the device runs the step before.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        max_tokens: int,
        block_size: int,
        arrival_time: float | None = None,
        seed: int | None = None,
        parent_id: str | None = None,
        index: int = 0,
    ) -> None:
        self.request_id = request_id
        self.parent_id = parent_id if parent_id is not None else request_id
        self.index = index  # position among the parent's n samples
        self.sampling_params = sampling_params
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.max_tokens = max_tokens
        self.seed = seed
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens sampled on the device by a step still in flight (async scheduling), not yet
        # in output_token_ids; num_computed_tokens already counts the step's inputs.
        self.num_pending = 0
        self.num_cached_tokens = -1  # prefix-cache hit on first schedule; -1 = not yet
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.block_size = block_size
        self._block_hashes: list[BlockHash] = []
        # Filled by the engine: sampled-token logprob entries etc.
        self.extra: dict[str, Any] = {}
        # Structured outputs: the xgrammar matcher following this sequence's tokens.
        self.grammar: Any = None
        # Embedding requests (PoolingParams): the step that completes the prompt also returns
        # its last token's final hidden state.
        self.pooling_params: Any = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finish_reason(self) -> str | None:
        return RequestStatus.get_finish_reason(self.status)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    @property
    def block_hashes(self) -> list[BlockHash]:
        """Chained hashes of every full block of `all_token_ids`; blocks completed since the
        last call are hashed now."""
        hashes, bs = self._block_hashes, self.block_size
        if len(self.all_token_ids) >= (len(hashes) + 1) * bs:  # cheap test: usually no new block
            start = len(hashes) * bs
            hashes += hash_blocks(hashes[-1] if hashes else None,
                                  self.all_token_ids[start:self.num_tokens // bs * bs], bs)
        return hashes

    def __repr__(self) -> str:
        return (f"Request(id={self.request_id!r}, status={self.status.name}, "
                f"prompt={self.num_prompt_tokens}, out={self.num_output_tokens}, "
                f"computed={self.num_computed_tokens})")
