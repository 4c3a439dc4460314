"""One request's output stream on the event loop, and the hand-over of outputs from
AsyncLLM's engine thread to the event loops of the requests (one wakeup per loop and step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol


class StatLogger(Protocol):
    """Receives per-request timing events from the engine thread."""

    def on_first_token(self, ttft_s: float) -> None: ...

    def on_tokens(self, inter_token_s: float) -> None: ...  # once per token after the first

    def on_finished(self, e2e_s: float, finish_reason: str | None) -> None: ...


class EngineLoopError(RuntimeError):
    """The engine failed while a request was in flight (the loop keeps running)."""


class RequestError(ValueError):
    """The engine failed this request alone (``RequestOutput.error``), e.g. bad input."""


class RequestStream:
    """Async iterator over one request's cumulative RequestOutputs: the newest one whenever
    the consumer takes one, so a consumer slower than the engine's steps skips outputs that
    a newer one contains, and the final output is always seen.

    ``close()`` before the final output aborts the request in the engine.
    """

    def __init__(self, llm: Any, request_id: str) -> None:
        self.request_id = request_id
        self._llm = llm
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._done = False
        # Timing, written by the engine thread only.
        self.arrival = time.monotonic()
        self.num_tokens = 0  # of its longest sequence (one token per step)
        self.last_token_time = 0.0

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        # An exception or a finished output ends the stream, so it is never skipped.
        while not (isinstance(item, BaseException) or item.finished) and not self._queue.empty():
            item = self._queue.get_nowait()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        if getattr(item, "error", None):
            raise RequestError(item.error)
        return item

    def close(self) -> None:
        """Abort the request unless it already finished (idempotent)."""
        if not self._done:
            self._done = True
            self._llm.abort(self.request_id)


def put_all(items: list[tuple[RequestStream, Any]]) -> None:
    # On the event loop: one wakeup delivers a whole step's outputs.
    for stream, item in items:
        stream._queue.put_nowait(item)


def answer_adds(items: list[tuple[asyncio.Future, BaseException | None]]) -> None:
    # On the event loop: answer add_request's callers (a cancelled caller needs no answer).
    for future, exc in items:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)


def call_on_loops(items: list, loop_of: Callable[[Any], asyncio.AbstractEventLoop],
                   callback: Callable[[list], None]) -> None:
    """From the engine thread: ``callback(batch)`` on each item's event loop, one
    call_soon_threadsafe (one wakeup of the loop) per loop, not one per item."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for item in items:
        by_loop.setdefault(loop_of(item), []).append(item)
    for loop, batch in by_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(callback, batch)


def deliver(items: list[tuple[RequestStream, Any]]) -> None:
    """Hand (stream, output or exception) pairs from the engine thread to their event loops."""
    call_on_loops(items, lambda item: item[0]._loop, put_all)
