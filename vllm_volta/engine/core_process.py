"""The LLMEngine in a process of its own, behind the engine interface AsyncLLM drives.

With the engine in the server's process, its host work (scheduling, input preparation, output
building) and the event loop's (one HTTP chunk per token and stream) share one interpreter
lock, and at many concurrent streams the server is host-bound. ``EngineCoreClient`` starts
an engine core process (spawned: it initializes CUDA itself) that steps the engine while it
has requests and sends each step's outputs back over a pipe; the server process keeps only
the event loop and the light client side.

Protocol over one duplex pipe (pickled tuples):
    core -> client  ("ready", model_config, tokenizer) | ("failed", message)
                    ("added", request_id, error or None)
                    ("step", outputs, stats) | ("step_error", message)
    client -> core  ("add", request_id, prompt, params) | ("abort", request_ids) | ("shutdown",)
A request's first output carries its prompt token ids, later ones travel without them (the
client puts them back), so a step's message grows with the new tokens, not with the prompts.
"""
from __future__ import annotations

import collections
import multiprocessing
from typing import Any

from vllm_volta.logger import init_logger

logger = init_logger(__name__)


class EngineCoreDied(RuntimeError):
    """The engine core process exited or its pipe broke."""


def _core_main(engine_args: Any, conn: Any) -> None:
    """Entry point of the engine core process."""
    from vllm_volta.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine.from_engine_args(engine_args)
    except BaseException as exc:  # startup errors go back to the server
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", engine.model_config, engine.get_tokenizer()))
    prompt_sent: set[str] = set()  # requests whose prompt ids went with an earlier output
    try:
        while True:
            # Idle: wait for a command. Busy: take what arrived, then step.
            while not engine.has_unfinished_requests() or conn.poll():
                cmd = conn.recv()
                if cmd[0] == "shutdown":
                    return
                if cmd[0] == "add":
                    _, request_id, prompt, params = cmd
                    try:
                        engine.add_request(request_id, prompt, params)
                    except Exception as exc:  # bad input fails this request only
                        conn.send(("added", request_id, exc))
                    else:
                        conn.send(("added", request_id, None))
                elif cmd[0] == "abort":
                    engine.abort_request(cmd[1])
                    prompt_sent.difference_update(cmd[1])
            try:
                outputs = engine.step()
            except Exception as exc:
                logger.exception("engine step failed")
                conn.send(("step_error", f"{type(exc).__name__}: {exc}"))
                continue
            for out in outputs:
                if out.request_id in prompt_sent:
                    out.prompt_token_ids = None
                    if out.finished:
                        prompt_sent.discard(out.request_id)
                elif not out.finished:
                    prompt_sent.add(out.request_id)
            conn.send(("step", outputs, engine.get_stats()))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the server went away
    finally:
        engine.shutdown()


class EngineCoreClient:
    """The engine interface AsyncLLM uses (add_request, abort_request, step,
    has_unfinished_requests, get_stats, get_tokenizer, model_config, shutdown), served by an
    engine core process. Used from one thread (AsyncLLM's)."""

    def __init__(self, engine_args: Any, *, startup_timeout: float = 3600.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_core_main, args=(engine_args, child),
                                 name="vllm-volta-engine-core", daemon=True)
        self._proc.start()
        child.close()
        self._steps: collections.deque = collections.deque()  # step messages read early
        self._prompts: dict[str, list[int] | None] = {}  # in flight: id -> prompt token ids
        self._stats: Any = None
        msg = self._recv(startup_timeout)
        if msg[0] == "failed":
            self._proc.join(10)
            raise RuntimeError(f"engine core failed to start: {msg[1]}")
        _, self.model_config, self._tokenizer = msg
        logger.info("Engine core running in process %d", self._proc.pid)

    def _recv(self, timeout: float | None = None) -> tuple:
        try:
            if timeout is not None and not self._conn.poll(timeout):
                raise EngineCoreDied(f"no answer from the engine core in {timeout:.0f} s")
            return self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineCoreDied(f"the engine core process is gone (exit code "
                                 f"{self._proc.exitcode})") from exc

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, OSError) as exc:
            raise EngineCoreDied("the engine core process is gone") from exc

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def get_stats(self) -> Any:
        return self._stats

    def has_unfinished_requests(self) -> bool:
        return bool(self._prompts)

    def add_request(self, request_id: str, prompt: Any, params: Any) -> None:
        """Add a request; the core's ValueError for bad input is raised here."""
        self._send(("add", request_id, prompt, params))
        while True:
            msg = self._recv()
            if msg[0] != "added":
                self._steps.append(msg)  # a step that finished meanwhile
                continue
            if msg[1] != request_id:
                raise EngineCoreDied(f"engine core answered for {msg[1]!r}, not {request_id!r}")
            if msg[2] is not None:
                raise msg[2]
            break
        self._prompts[request_id] = None  # filled from its first output

    def abort_request(self, request_ids: Any) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            self._prompts.pop(rid, None)
        self._send(("abort", ids))

    def _next_step_message(self, block: bool) -> tuple | None:
        if self._steps:
            return self._steps.popleft()
        if not block and not self._conn.poll():
            return None
        return self._recv()

    def step(self) -> list[Any]:
        """The outputs of every step the core finished since the last call (blocks until one
        has): the newest output per request, as outputs are cumulative. Reading them all at
        once keeps the core stepping when this process falls behind."""
        merged: dict[str, Any] = {}
        msg = self._next_step_message(block=True)
        while msg is not None:
            if msg[0] == "step_error":
                if merged:  # deliver what came before it first
                    self._steps.appendleft(msg)
                    break
                raise RuntimeError(msg[1])
            if msg[0] != "step":
                raise EngineCoreDied(f"unexpected message from the engine core: {msg[0]!r}")
            _, outputs, self._stats = msg
            for out in outputs:
                if out.prompt_token_ids is None and out.request_id in merged:
                    out.prompt_token_ids = merged[out.request_id].prompt_token_ids
                merged[out.request_id] = out
            msg = self._next_step_message(block=False)
        live = []
        for out in merged.values():
            if out.request_id not in self._prompts:  # aborted while the step ran
                continue
            if out.prompt_token_ids is None:
                out.prompt_token_ids = self._prompts[out.request_id]
            else:
                self._prompts[out.request_id] = out.prompt_token_ids
            if out.finished:
                del self._prompts[out.request_id]
            live.append(out)
        return live

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("shutdown",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
