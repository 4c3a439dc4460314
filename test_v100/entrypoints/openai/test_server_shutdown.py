"""SIGTERM: the server stops accepting connections, gives running requests --shutdown-timeout
seconds, then ends each remaining stream with an error event and [DONE], and exits with 0."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MODEL_NAME, SERVER_ARGS
from test_v100.entrypoints.openai.fault_utils import stream_in_thread
from test_v100.entrypoints.openai.utils import RemoteServer

MAX_LEN = 256
TIMEOUT_S = 1.0


@pytest.mark.parametrize("kind", ["--no-engine-process", "--engine-process"])
def test_sigterm_ends_streams_cleanly(tiny_model, kind):
    # Two sequences at a time and eight long streams: the last ones are still queued or
    # running when the timeout passes, whatever the CPU's speed.
    args = ["--model", tiny_model, *SERVER_ARGS, "--max-model-len", str(MAX_LEN),
            "--max-num-seqs", "2", "--shutdown-timeout", str(TIMEOUT_S), kind]
    server = RemoteServer(args)
    try:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": MAX_LEN - 32, "ignore_eos": True}
        started = [threading.Event() for _ in range(8)]
        streams = [stream_in_thread(server.url, body, ev, path="/v1/chat/completions")
                   for ev in started]
        for ev in started:  # every stream is open (a chat stream sends its role at once)
            assert ev.wait(60)
        server.proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        time.sleep(0.3)
        with pytest.raises(httpx.HTTPError):  # no new connections once it is stopping
            httpx.get(server.url + "/health", timeout=2)
        assert server.proc.wait(30) == 0, server.log()
        ended_by_error = 0
        for thread, result in streams:
            thread.join(10)
            assert not thread.is_alive()
            assert result.error is None, result.error  # never cut without a terminal event
            assert result.events and result.events[-1] == "[DONE]", result.events[-3:]
            errors = result.error_events
            if errors:
                ended_by_error += 1
                assert errors[0]["error"]["code"] == 503
                assert "shutting down" in errors[0]["error"]["message"]
                assert result.ended_at - sent_at >= TIMEOUT_S - 0.1  # they had their time
            else:  # finished within the timeout: a normal end
                assert result.events[-2]["choices"][0]["finish_reason"] == "length"
        assert ended_by_error >= 1
    finally:
        server.close()
