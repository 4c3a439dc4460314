"""Start ``vllm-volta serve`` for the serving benchmark and stop it afterwards.

The server runs as a child process on a free local port; its output goes to a log file whose
tail is shown if it fails to come up (kept after a failure, removed after a clean run).
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

import httpx

from benchmarks.utils import log

# Calls the console-script entry point without needing the script on PATH.
_LAUNCH = ("import sys; from vllm_volta.entrypoints.cli import main; "
           "sys.argv[0] = 'vllm-volta'; sys.exit(main())")


def free_port() -> int:
    """A port the OS reports free right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_flags(engine_kwargs: dict[str, Any]) -> list[str]:
    """EngineArgs keyword arguments as ``vllm-volta serve`` flags (vLLM's spelling)."""
    flags: list[str] = []
    for key, value in engine_kwargs.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        elif value is not False:
            flags += [flag, str(value)]
    return flags


def _tail(path: str, lines: int = 40) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def wait_until_ready(base_url: str, proc: subprocess.Popen, timeout: float,
                     log_path: str) -> None:
    """Poll /health until it answers 200; fail early if the server process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}; last log lines "
                               f"({log_path}):\n{_tail(log_path)}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {timeout:.0f} s (--server-timeout); last log "
                       f"lines ({log_path}):\n{_tail(log_path)}")


@contextlib.contextmanager
def launched_server(model: str, flags: list[str], timeout: float, log_path: str | None = None
                    ) -> Iterator[tuple[str, int]]:
    """Run ``vllm-volta serve model flags...``; yields its base URL and process id, stops it on
    exit. Its log goes to `log_path` when given (kept), else to a temporary file (kept only
    after a failure)."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-c", _LAUNCH, "serve", model, "--host", "127.0.0.1",
           "--port", str(port), *flags]
    log_file = (open(log_path, "w") if log_path else
                tempfile.NamedTemporaryFile("w", prefix="vllm-volta-serve-", suffix=".log", delete=False))
    with log_file as logf:
        log(f"starting server: vllm-volta serve {model} --port {port} {' '.join(flags)} "
            f"(log: {logf.name})")
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_until_ready(base_url, proc, timeout, logf.name)
        log(f"server ready at {base_url}")
        yield base_url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not log_path:
        os.unlink(logf.name)  # only reached without an error: failures keep their log
