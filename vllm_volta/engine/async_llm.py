"""AsyncLLM: the asyncio front of the step-driven LLMEngine, used by the server.

One background thread owns the engine and drives ``step()``; every request the
event loop submits lands in the same engine, so all concurrent requests are
batched together by the scheduler. Requests beyond ``max_num_seqs`` simply wait
in the scheduler's queue. The event loop talks to the thread through a command
queue (add / abort / shutdown) and receives outputs through per-request
``asyncio.Queue``s, so the engine itself is only ever touched by one thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from vllm_volta import envs
from vllm_volta.engine.engine_errors import EngineDeadError, is_fatal
from vllm_volta.engine.request_stream import (EngineLoopError, RequestError, RequestStream,
                                              StatLogger, answer_adds, call_on_loops, deliver)
from vllm_volta.logger import init_logger

logger = init_logger(__name__)


# Re-exported: the server and tests import them from here.
__all__ = ["AsyncLLM", "EngineLoopError", "RequestError", "RequestStream", "StatLogger"]


_STOP = object()
_HEALTH_INTERVAL_S = 0.2  # an idle loop checks the engine this often (a dead core is seen fast)


def _idle_stats(stats: Any) -> Any:
    """Stats of an engine that holds no request (what a dead engine's gauges must show)."""
    if not dataclasses.is_dataclass(stats):
        return None
    return dataclasses.replace(stats, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                               num_free_blocks=stats.num_total_blocks)


class AsyncLLM:
    """Asynchronous wrapper that batches all concurrent requests into one LLMEngine."""

    def __init__(self, engine: Any, stat_loggers: list[StatLogger] | None = None, *,
                 owns_engine: bool = False,
                 engine_factory: Callable[[], Any] | None = None) -> None:
        """``engine_factory``: builds a fresh engine when this one dies (a fatal error, see
        engine_errors.is_fatal); without it a dead engine stays dead (``dead`` is set)."""
        self.engine = engine
        self.owns_engine = owns_engine  # shut the engine down with the loop
        self.engine_factory = engine_factory
        self.dead: EngineDeadError | None = None  # why the engine cannot serve (None: it can)
        self.restarting = False
        self.num_restarts = 0
        self._fault_after = envs.VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS  # testing: die at step N
        self._engine_closed = False
        self._num_steps = 0
        self.stat_loggers: list[StatLogger] = list(stat_loggers or [])
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, RequestStream] = {}  # owned by the engine thread
        self._adds: list[tuple[asyncio.Future, BaseException | None]] = []  # answers to send
        self._stats: Any = self._read_stats()
        self._shutdown = False
        self._thread = threading.Thread(target=self._run, name="vllm-volta-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, engine_args: Any, *, engine_process: bool = False,
                         restart_on_failure: bool = False, **kwargs: Any) -> AsyncLLM:
        """Build the engine from ``EngineArgs`` (in this process, or with ``engine_process`` in
        an engine core process of its own) and start the background loop. With
        ``restart_on_failure`` an engine that dies is replaced by a new one."""

        def build() -> Any:
            if engine_process:
                from vllm_volta.engine.core_process import EngineCoreClient

                return EngineCoreClient(engine_args)
            from vllm_volta.engine.llm_engine import LLMEngine

            return LLMEngine.from_engine_args(engine_args)

        return cls(build(), owns_engine=True,
                   engine_factory=build if restart_on_failure else None, **kwargs)

    # ------------------------------------------------------------------ public API
    @property
    def model_config(self) -> Any:
        return self.engine.model_config

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    def get_stats(self) -> Any:
        """Latest engine stats snapshot (refreshed by the loop after every step/abort)."""
        return self._stats

    @property
    def is_running(self) -> bool:
        """True while the engine can take requests (False when dead, restarting or shut down)."""
        return self._thread.is_alive() and not self._shutdown and self.dead is None

    @property
    def failed(self) -> bool:
        """True when the engine died and no new one will start (the server should exit)."""
        return self.dead is not None and (self.engine_factory is None
                                          or not self._thread.is_alive())

    @property
    def num_requests(self) -> int:
        """Requests in flight (a snapshot)."""
        return len(self._requests)

    async def add_request(self, request_id: str, prompt: str | list[int],
                          sampling_params: Any) -> RequestStream:
        """Submit a request; returns its output stream once the engine accepted it.

        Invalid input raises ``ValueError`` (from the engine) here. The caller must
        iterate the stream to the end or ``close()`` it (which aborts the request).
        """
        if self.dead is not None:
            raise EngineDeadError(str(self.dead))
        if self._shutdown:
            raise EngineDeadError("AsyncLLM is shut down")
        stream = RequestStream(self, request_id)
        added = stream._loop.create_future()  # answered by the engine thread (_settle_adds)
        self._commands.put(("add", request_id, prompt, sampling_params, stream, added))
        try:
            await added
        except asyncio.CancelledError:
            stream.close()  # the add may have gone through after all
            raise
        return stream

    async def generate(self, prompt: str | list[int], sampling_params: Any,
                       request_id: str) -> AsyncIterator[Any]:
        """Yield the request's cumulative ``RequestOutput``s until it finishes.

        Closing or cancelling the iterator early aborts the request, which frees
        its KV blocks.
        """
        stream = await self.add_request(request_id, prompt, sampling_params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe, non-blocking); its KV blocks are freed."""
        self._commands.put(("abort", request_id))

    def fail_requests(self, exc: BaseException) -> None:
        """Abort every request in flight and end its stream with ``exc`` (thread-safe)."""
        self._commands.put(("fail_all", exc))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop thread; pending requests fail with an error."""
        if self._shutdown:
            return
        self._shutdown = True
        self._commands.put((_STOP,))
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_engine()

    # ------------------------------------------------------------- engine thread
    def _read_stats(self) -> Any:
        get_stats = getattr(self.engine, "get_stats", None)
        if get_stats is None:
            return None
        try:
            return get_stats()
        except Exception:  # stats are best effort; never kill the loop for them
            logger.exception("get_stats() failed")
            return None

    def _handle_command(self, cmd: tuple) -> bool:
        """Apply one command; returns False when the loop must stop."""
        kind = cmd[0]
        if kind is _STOP:
            return False
        if kind == "add":
            _, request_id, prompt, params, stream, added = cmd
            if added.cancelled():  # caller gave up already
                return True
            try:
                if request_id in self._requests:
                    raise ValueError(f"request_id {request_id!r} is already in use")
                self.engine.add_request(request_id, prompt, params)
            except Exception as exc:  # bad input fails this request only
                if is_fatal(exc):
                    self._adds.append((added, EngineDeadError(f"the engine died: {exc}")))
                    raise
                self._adds.append((added, exc))
            else:
                self._requests[request_id] = stream
                self._adds.append((added, None))
        elif kind == "abort":
            request_id = cmd[1]
            if self._requests.pop(request_id, None) is not None:
                try:
                    self.engine.abort_request([request_id])
                except Exception as exc:
                    if is_fatal(exc):
                        raise
                    logger.exception("abort of %s failed", request_id)
        elif kind == "fail_all":
            if self._requests:
                logger.warning("Ending %d requests in flight: %s", len(self._requests), cmd[1])
                try:
                    self.engine.abort_request(list(self._requests))
                finally:
                    self._fail_all(cmd[1])
        return True

    def _drain_commands(self) -> bool:
        # Idle: block until something arrives. Busy: take what is queued and step.
        block = not self._requests
        try:
            while True:
                try:
                    cmd = self._commands.get(block=block,
                                             timeout=_HEALTH_INTERVAL_S if block else None)
                except queue.Empty:
                    if not block:
                        return True
                    self._check_health()  # idle: raises if the engine died meanwhile
                    continue
                if not self._handle_command(cmd):
                    return False
                block = False
        finally:
            self._settle_adds()

    def _run(self) -> None:
        try:
            while True:
                try:
                    self._serve()
                    return  # asked to stop
                except Exception as exc:  # fatal: the engine cannot serve any more
                    if not self._recover(exc):
                        return
        finally:
            error = self.dead or EngineDeadError("AsyncLLM is shut down")
            self._fail_all(error)
            self._fail_queued_adds(error)

    def _serve(self) -> None:
        while self._drain_commands():
            if self._requests and self.engine.has_unfinished_requests():
                self._step()
            elif self._requests:  # the engine dropped them silently: never spin on it
                self._fail_all(EngineLoopError("the engine lost track of the request"))
            self._stats = self._read_stats()

    def _check_health(self) -> None:
        check = getattr(self.engine, "check_health", None)
        if check is not None:
            check()

    def _recover(self, exc: Exception) -> bool:
        """The engine died: fail what is in flight, then start a new engine when a factory
        was given. Returns whether the loop serves on."""
        logger.error("The engine died (%s: %s); failing %d requests in flight",
                     type(exc).__name__, exc, len(self._requests),
                     exc_info=not isinstance(exc, EngineDeadError))
        self.dead = exc if isinstance(exc, EngineDeadError) else \
            EngineDeadError(f"the engine died: {type(exc).__name__}: {exc}")
        self._stats = _idle_stats(self._stats)
        self._fail_all(self.dead)
        self._settle_adds()
        self._close_engine()
        if self.engine_factory is None or self._shutdown:
            return False
        logger.warning("Starting a new engine (--restart-engine-on-failure)")
        self.restarting = True
        try:
            engine = self.engine_factory()
        except Exception:
            logger.exception("The new engine failed to start")
            return False
        finally:
            self.restarting = False
        self.engine, self._engine_closed = engine, False
        self.num_restarts += 1
        self._stats = self._read_stats()
        self.dead = None
        logger.info("Engine restarted (%d restart(s) so far); serving again", self.num_restarts)
        return True

    def _close_engine(self) -> None:
        if not self.owns_engine or self._engine_closed:
            return
        self._engine_closed = True
        try:
            self.engine.shutdown()
        except Exception:  # a dead engine may fail to stop cleanly; it is dropped anyway
            logger.exception("engine shutdown failed")

    def _step(self) -> None:
        try:
            self._num_steps += 1
            if self._fault_after is not None and self._num_steps > self._fault_after:
                self._fault_after = None  # once: a restarted engine serves normally
                raise EngineDeadError("injected engine fault (VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS)")
            outputs = self.engine.step()
        except Exception as exc:
            if is_fatal(exc):
                raise
            # The engine cannot tell which request broke the step: fail the ones in
            # flight, clear them out of the engine, and keep serving new requests.
            logger.exception("engine step failed; failing %d in-flight requests",
                             len(self._requests))
            ids = list(self._requests)
            try:
                self.engine.abort_request(ids)
            except Exception:
                logger.exception("cleanup abort failed")
            self._fail_all(EngineLoopError(f"engine step failed: {exc}"))
            return
        now = time.monotonic()
        # Refresh before delivering, so a consumer that sees an output sees its KV usage.
        self._stats = self._read_stats()
        delivered = []
        for out in outputs:
            stream = self._requests.get(out.request_id)
            if stream is None:  # aborted meanwhile
                continue
            try:
                self._record_timing(stream, out, now)
            except Exception:  # metrics are best effort; the output still goes out
                logger.exception("stat logger failed")
            if out.finished:
                del self._requests[out.request_id]
            delivered.append((stream, out))
        deliver(delivered)

    def _record_timing(self, state: RequestStream, out: Any, now: float) -> None:
        """TTFT, one inter-token gap per token after the first (the longest sequence's, one
        token per step) and e2e, as the stream's consumer sees them: an output that brings
        several tokens at once (steps merged by an engine core process that ran ahead) gives
        the wait before it to its first new token and 0 to the others."""
        if not self.stat_loggers:
            return
        num_tokens = max((len(c.token_ids) for c in out.outputs), default=0)
        new = num_tokens - state.num_tokens
        for stat in self.stat_loggers:
            if new > 0:
                if state.num_tokens == 0:
                    stat.on_first_token(now - state.arrival)
                else:
                    stat.on_tokens(now - state.last_token_time)
                for _ in range(new - 1):
                    stat.on_tokens(0.0)
            if out.finished:
                reason = out.outputs[0].finish_reason if out.outputs else None
                stat.on_finished(now - state.arrival, reason)
        if new > 0:
            state.num_tokens = num_tokens
            state.last_token_time = now

    def _fail_all(self, exc: BaseException) -> None:
        deliver([(stream, exc) for stream in self._requests.values()])
        self._requests.clear()

    def _settle_adds(self) -> None:
        """Answer the adds taken so far: one wakeup per event loop for all of them."""
        call_on_loops(self._adds, lambda item: item[0].get_loop(), answer_adds)
        self._adds = []

    def _fail_queued_adds(self, error: BaseException) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if cmd[0] == "add":
                self._adds.append((cmd[5], EngineDeadError(str(error))))
        self._settle_adds()
