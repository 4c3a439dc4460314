"""The LLMEngine in a process of its own, behind the engine interface AsyncLLM drives.

With the engine in the server's process, its host work (scheduling, input preparation, output
building) and the event loop's (one HTTP chunk per token and stream) share one interpreter
lock, and at many concurrent streams the server is host-bound. ``EngineCoreClient`` starts
an engine core process (spawned: it initializes CUDA itself) that steps the engine while it
has requests and sends each step's outputs back over a pipe; the server process keeps only
the event loop and the light client side.

Protocol over one duplex pipe (pickled tuples):
    core -> client  ("ready", model_config, tokenizer, stats) | ("failed", message)
                    ("step", outputs, stats) | ("step_error", message)
                    ("add_failed", request_id, message) | ("aborted", stats)
                    | ("fatal", message)  (a failure that ends the core: engine_errors.is_fatal)
    client -> core  ("add", request_id, prompt_token_ids, params) | ("abort", request_ids)
                    | ("shutdown",)
The client checks and tokenizes a request itself (InputProcessor), so bad input fails at once
without a round trip and an add needs no answer. Outputs cross as deltas without the prompt
(core_outputs.py; the client puts the prompt back), so a step's message holds the step's new
tokens, not every request's whole history.
"""
from __future__ import annotations

import collections
import multiprocessing
import queue
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

from vllm_volta.engine.core_outputs import OutputDecoder, OutputEncoder
from vllm_volta.engine.engine_errors import EngineDeadError, is_fatal
from vllm_volta.engine.input_processor import InputProcessor
from vllm_volta.logger import init_logger
from vllm_volta.outputs import RequestOutput

logger = init_logger(__name__)


class EngineCoreDied(EngineDeadError):
    """The engine core process exited or its pipe broke."""


class _PipeWriter:
    """Sends the core's messages from a thread of their own. A send blocks while the client's
    end of the pipe is full (its process busy with the event loop), and the core's thread
    should be scheduling and launching the next step instead. Messages are pickled by the
    caller, in order, so what is sent is the state at the time of the call."""

    def __init__(self, conn: Any, max_queued: int = 256) -> None:
        self._conn = conn
        self._queue: queue.Queue = queue.Queue(max_queued)  # full: the caller waits (back-pressure)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-volta-core-writer",
                                        daemon=True)
        self._thread.start()

    def send(self, msg: tuple) -> None:
        data = ForkingPickler.dumps(msg)
        while True:  # a full queue waits, unless the thread has stopped on an error
            if self.error is not None:
                raise BrokenPipeError(f"the client is gone: {self.error}")
            try:
                self._queue.put(data, timeout=0.1)
                return
            except queue.Full:
                pass

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._conn.send_bytes(data)
            except BaseException as exc:  # the client went away; the core loop sees .error
                self.error = exc
                return

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread. A client that stopped reading (it asked
        the core to shut down) is not waited for beyond `timeout` (the thread is a daemon)."""
        if self.error is not None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)


def _core_main(engine_args: Any, conn: Any) -> None:
    """Entry point of the engine core process."""
    from vllm_volta.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine.from_engine_args(engine_args)
    except BaseException as exc:  # startup errors go back to the server
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", engine.model_config, engine.get_tokenizer(), engine.get_stats()))
    encoder = OutputEncoder()
    engine.output_builder = encoder.encode  # steps return wire items, not RequestOutputs
    writer = _PipeWriter(conn)
    try:
        while True:
            # Idle: wait for a command. Busy: take what arrived, then step.
            while not engine.has_unfinished_requests() or conn.poll():
                cmd = conn.recv()
                if cmd[0] == "shutdown":
                    return
                if cmd[0] == "add":
                    _, request_id, token_ids, params = cmd
                    try:
                        engine.add_request(request_id, token_ids, params)
                    except Exception as exc:  # the client checked it; fail this request only
                        writer.send(("add_failed", request_id, f"{type(exc).__name__}: {exc}"))
                elif cmd[0] == "abort":
                    engine.abort_request(cmd[1])
                    encoder.forget(cmd[1])
                    writer.send(("aborted", engine.get_stats()))
            try:
                outputs = engine.step()
            except Exception as exc:
                logger.exception("engine step failed")
                if is_fatal(exc):  # the device or a worker is gone: stop, the server decides
                    writer.send(("fatal", f"{type(exc).__name__}: {exc}"))
                    return
                writer.send(("step_error", f"{type(exc).__name__}: {exc}"))
                continue
            writer.send(("step", outputs, engine.get_stats()))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the server went away
    finally:
        writer.close()
        engine.shutdown()


class EngineCoreClient:
    """The engine interface AsyncLLM uses (add_request, abort_request, step,
    has_unfinished_requests, get_stats, get_tokenizer, model_config, shutdown), served by an
    engine core process. Used from one thread (AsyncLLM's)."""

    def __init__(self, engine_args: Any, *, startup_timeout: float = 3600.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # Not a daemon: with tensor parallelism it starts the rank processes itself. It stops on
        # shutdown(), when this object is collected or the interpreter exits (the finalizer),
        # and by itself when the pipe breaks (this process died).
        self._proc = ctx.Process(target=_core_main, args=(engine_args, child),
                                 name="vllm-volta-engine-core")
        self._proc.start()
        child.close()
        self._finalizer = weakref.finalize(self, _stop_core, self._proc, self._conn)
        self._steps: collections.deque = collections.deque()  # step messages read early
        # In flight: request id -> (prompt text, prompt token ids), put back on its outputs.
        self._prompts: dict[str, tuple[str | None, list[int]]] = {}
        self._decoder = OutputDecoder()
        self._aborts_unanswered = 0
        self._stats: Any = None
        msg = self._recv(startup_timeout)
        if msg[0] == "failed":
            self._finalizer()
            raise RuntimeError(f"engine core failed to start: {msg[1]}")
        _, self.model_config, self._tokenizer, self._stats = msg
        self._inputs = InputProcessor(self.model_config, self._tokenizer)
        logger.info("Engine core running in process %d", self._proc.pid)

    def _recv(self, timeout: float | None = None) -> tuple:
        try:
            if timeout is not None and not self._conn.poll(timeout):
                raise EngineCoreDied(f"no answer from the engine core in {timeout:.0f} s")
            msg = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineCoreDied(f"the engine core process is gone (exit code "
                                 f"{self._proc.exitcode})") from exc
        if msg[0] in ("step", "aborted"):  # the newest stats are the last ones received
            self._stats = msg[-1]
        if msg[0] == "aborted":
            self._aborts_unanswered -= 1
        if msg[0] == "fatal":
            raise EngineCoreDied(f"the engine core failed: {msg[1]}")
        return msg

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, OSError) as exc:
            raise EngineCoreDied("the engine core process is gone") from exc

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def check_health(self) -> None:
        """EngineCoreDied when the core process has exited (AsyncLLM asks while idle)."""
        if not self._proc.is_alive():
            raise EngineCoreDied(f"the engine core process exited (exit code "
                                 f"{self._proc.exitcode})")

    def get_stats(self) -> Any:
        return self._stats

    def has_unfinished_requests(self) -> bool:
        return bool(self._prompts)

    def add_request(self, request_id: str, prompt: Any, params: Any) -> None:
        """Check, tokenize and send a request; bad input raises ValueError here."""
        if request_id in self._prompts:
            raise ValueError(f"request_id {request_id!r} is already in use")
        prompt_text, token_ids, params = self._inputs.process(prompt, params)
        self._send(("add", request_id, token_ids, params))
        self._prompts[request_id] = (prompt_text, token_ids)

    def abort_request(self, request_ids: Any) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            self._prompts.pop(rid, None)
        self._decoder.forget(ids)
        self._send(("abort", ids))
        self._aborts_unanswered += 1
        if not self._prompts:
            # Nothing left to step, so no step message would bring fresh stats: wait for the
            # core's answers (after its current step at most), so the stats read next show the
            # freed blocks, as with the engine in this process. With requests in flight the
            # answer is read with the next steps, and the abort does not wait.
            while self._aborts_unanswered:
                msg = self._recv()
                if msg[0] != "aborted":
                    self._steps.append(msg)

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
        touched: dict[str, Any] = {}  # request id -> its decoder state, or a failed output
        msg = self._next_step_message(block=True)
        while msg is not None:
            if msg[0] == "step_error":
                if touched:  # deliver what came before it first
                    self._steps.appendleft(msg)
                    break
                raise RuntimeError(msg[1])
            if msg[0] == "step":
                self._decoder.apply(msg[1], touched, self._prompts)
            elif msg[0] == "aborted":
                pass  # an answer to an earlier abort: its stats were taken on receipt
            elif msg[0] == "add_failed":
                _, request_id, error = msg
                touched[request_id] = RequestOutput(request_id, None, None, None, [],
                                                    finished=True, error=error)
            else:
                raise EngineCoreDied(f"unexpected message from the engine core: {msg[0]!r}")
            msg = self._next_step_message(block=False)
        live = []
        for rid, state in touched.items():
            out = state if isinstance(state, RequestOutput) else self._decoder.build(rid, state)
            prompt = (self._prompts.pop if out.finished else self._prompts.get)(rid)
            if prompt is None:  # aborted while the step ran
                continue
            out.prompt, out.prompt_token_ids = prompt
            live.append(out)
        return live

    def shutdown(self) -> None:
        self._finalizer()


def _stop_core(proc: Any, conn: Any, timeout: float = 30.0) -> None:
    """Ask the core to stop; kill it when it does not within ``timeout`` seconds."""
    if proc.is_alive():
        try:
            conn.send(("shutdown",))
        except (BrokenPipeError, OSError):
            pass
        proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
    conn.close()
