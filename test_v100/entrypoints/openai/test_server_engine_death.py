"""Engine death under load, for both server kinds: the engine core process killed
(--engine-process) and the engine loop failing (--no-engine-process, injected with
VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS). Without --restart-engine-on-failure /health turns 503
within a second, every stream ends with an error event then [DONE], and the server exits with
status 1; with it, new requests get 503 and /metrics counts nothing while the new engine
starts, then the server serves again."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MODEL_NAME, SERVER_ARGS
from test_v100.entrypoints.openai.fault_utils import (core_pid, stream_in_thread,
                                                      wait_for_status)
from test_v100.entrypoints.openai.utils import RemoteServer, metric

MAX_LEN = 256
ARGS = [*SERVER_ARGS, "--max-model-len", str(MAX_LEN)]  # the later flag wins
LONG = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": MAX_LEN - 8, "ignore_eos": True}
NUM_STREAMS = 4


def _start_streams(url: str) -> list:
    first = [threading.Event() for _ in range(NUM_STREAMS)]
    streams = [stream_in_thread(url, LONG, ev) for ev in first]
    for ev in first:
        assert ev.wait(60), "no stream started"
    return streams


def _check_failed_streams(streams: list, died_at: float) -> None:
    for thread, result in streams:
        thread.join(30)
        assert not thread.is_alive(), "a stream hangs after the engine died"
        assert result.error is None, result.error  # ended by the server, not cut
        assert result.events[-1] == "[DONE]", result.events[-3:]
        errors = result.error_events
        assert len(errors) == 1 and errors[0]["error"]["code"] == 503, errors
        assert result.ended_at - died_at < 5.0


def _fault_env(kind: str) -> dict[str, str]:
    # In the server's process the loop "dies" after a few steps; a killed core needs no help.
    return {"VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS": "20"} if kind == "in-process" else {}


def _kill_or_wait(server: RemoteServer, kind: str) -> float:
    if kind == "engine-process":
        os.kill(core_pid(server), signal.SIGKILL)
    return time.monotonic()


@pytest.mark.parametrize("kind", ["engine-process", "in-process"])
def test_engine_death_exits_the_server(tiny_model, kind):
    flag = "--engine-process" if kind == "engine-process" else "--no-engine-process"
    server = RemoteServer(["--model", tiny_model, *ARGS, flag], env=_fault_env(kind))
    try:
        streams = _start_streams(server.url)
        died_at = _kill_or_wait(server, kind)
        assert wait_for_status(server.url + "/health", 503, 5.0) < 1.0 + (
            2.0 if kind == "in-process" else 0.0)  # the injected fault comes a few steps later
        _check_failed_streams(streams, died_at)
        assert server.proc.wait(30) == 1, server.log()
        assert "stopping the server with exit status 1" in server.log(tail=10**6)
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["engine-process", "in-process"])
def test_restart_engine_on_failure(tiny_model, kind):
    flag = "--engine-process" if kind == "engine-process" else "--no-engine-process"
    with RemoteServer(["--model", tiny_model, *ARGS, flag, "--restart-engine-on-failure"],
                      env=_fault_env(kind)) as server:
        streams = _start_streams(server.url)
        died_at = _kill_or_wait(server, kind)
        _check_failed_streams(streams, died_at)
        if kind == "engine-process":  # a new core takes seconds to spawn: look meanwhile
            resp = httpx.post(server.url + "/v1/completions", timeout=30,
                              json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
            if resp.status_code != 200:  # else the restart was already done
                assert resp.status_code == 503, resp.text
                assert resp.json()["error"]["code"] == 503
                page = httpx.get(server.url + "/metrics", timeout=10).text
                assert metric(page, "vllm:num_requests_running") == 0
        wait_for_status(server.url + "/health", 200, 120.0)
        resp = httpx.post(server.url + "/v1/completions", timeout=60,
                          json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 3,
                                "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 3
        assert server.proc.poll() is None  # still the same server
        page = httpx.get(server.url + "/metrics", timeout=10).text
        assert metric(page, "vllm:num_requests_running") == 0
