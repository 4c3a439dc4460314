"""Helpers of the fault tests: streams read in threads, the engine core's pid, raw bodies."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from test_v100.entrypoints.openai.utils import RemoteServer


@dataclass
class StreamResult:
    """What one streamed request received: its data events and when the stream ended."""

    events: list[Any] = field(default_factory=list)  # parsed JSON, or the string "[DONE]"
    status: int | None = None
    ended_at: float | None = None
    error: str | None = None  # a transport error (the stream was cut)

    @property
    def error_events(self) -> list[dict]:
        return [e for e in self.events if isinstance(e, dict) and "error" in e]

    @property
    def num_tokens(self) -> int:
        return sum(1 for e in self.events if isinstance(e, dict) and e.get("choices")
                   and e["choices"][0].get("text"))


def stream_in_thread(url: str, body: dict, first_event: threading.Event | None = None,
                     headers: dict | None = None, path: str = "/v1/completions",
                     ) -> tuple[threading.Thread, StreamResult]:
    """POST a streaming request in a thread; ``first_event`` is set at its first event (a
    chat stream's first event, the role, comes before the request is scheduled)."""
    result = StreamResult()

    def run() -> None:
        try:
            with httpx.stream("POST", url + path, json={**body, "stream": True},
                              headers=headers, timeout=60) as resp:
                result.status = resp.status_code
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    result.events.append(data if data == "[DONE]" else json.loads(data))
                    if first_event is not None:
                        first_event.set()
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            result.ended_at = time.monotonic()
            if first_event is not None:
                first_event.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def core_pid(server: RemoteServer, timeout: float = 10.0) -> int:
    """The engine core process's pid, from the server's log line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(r"Engine core running in process (\d+)", server.log(tail=10**6))
        if found:
            return int(found[-1])
        time.sleep(0.1)
    raise AssertionError(f"no engine core pid in the log:\n{server.log()}")


def wait_for_status(url: str, status: int, timeout: float) -> float:
    """Poll GET url until it answers ``status``; returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if httpx.get(url, timeout=1).status_code == status:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"{url} did not answer {status} within {timeout} s")


def raw_post(url: str, body: dict, **kwargs: Any) -> httpx.Response:
    """POST ``body`` as ASCII JSON, so lone surrogates travel as \\ud800 escapes."""
    return httpx.post(url, content=json.dumps(body).encode(), timeout=60,
                      headers={"content-type": "application/json", **kwargs.pop("headers", {})},
                      **kwargs)
