"""One request cannot stall or break the others: large bodies (413 past --max-request-body-mb,
/health answering while 5 MB are tokenized, over-long prompts refused before tokenizing),
the API key on every route but /health, and text JSON carries that is not valid Unicode."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL_NAME, SERVER_ARGS
from test_v100.entrypoints.openai.fault_utils import raw_post
from test_v100.entrypoints.openai.utils import RemoteServer, metric

KEY = "sk-limits"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT_MB = 8


@pytest.fixture(scope="module")
def limited_server(tiny_model):
    args = ["--model", tiny_model, *SERVER_ARGS, "--api-key", KEY,
            "--max-request-body-mb", str(BODY_LIMIT_MB)]
    with RemoteServer(args) as srv:
        yield srv


def test_every_route_but_health_needs_the_key(limited_server):
    url = limited_server.url
    gets = ["/v1/models", "/version", "/metrics"]
    posts = {"/tokenize": {"prompt": "hi"}, "/detokenize": {"tokens": [5]},
             "/v1/completions": {"prompt": "hi", "max_tokens": 1}}
    for path in gets:
        assert httpx.get(url + path, timeout=10).status_code == 401, path
        assert httpx.get(url + path, headers=AUTH, timeout=10).status_code == 200, path
    for path, body in posts.items():
        resp = httpx.post(url + path, json=body, timeout=30)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == 401, path
        assert httpx.post(url + path, json=body, headers=AUTH, timeout=30).status_code == 200
    bad = {"Authorization": f"Bearer {KEY}x"}
    assert httpx.get(url + "/metrics", headers=bad, timeout=10).status_code == 401
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_metrics_without_auth_flag():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from vllm_volta.entrypoints.openai.middleware import APIKeyMiddleware

    ok = Starlette(routes=[Route(p, lambda _: PlainTextResponse("ok"))
                           for p in ("/metrics", "/health", "/tokenize")])
    for metrics_open, status in ((True, 200), (False, 401)):
        client = TestClient(APIKeyMiddleware(ok, KEY, metrics_open=metrics_open))
        assert client.get("/metrics").status_code == status
        assert client.get("/health").status_code == 200
        assert client.get("/tokenize").status_code == 401


def test_body_over_the_limit_is_413(limited_server):
    big = b'{"prompt": "' + b"a" * (BODY_LIMIT_MB * 2**20 + 10) + b'"}'
    headers = {**AUTH, "content-type": "application/json"}
    resp = httpx.post(limited_server.url + "/tokenize", content=big, headers=headers, timeout=30)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == 413
    assert "--max-request-body-mb" in resp.json()["error"]["message"]

    def chunks():  # no Content-Length: refused once the chunks read pass the limit
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]

    resp = httpx.post(limited_server.url + "/tokenize", content=chunks(), headers=headers,
                      timeout=30)
    assert resp.status_code == 413, resp.text


def test_health_answers_while_megabytes_are_tokenized(limited_server, hf_reference):
    tok, _ = hf_reference
    text = "hello world, the quick brown fox " * (2 * 2**20 // 33)  # 2 MB: seconds to tokenize
    result = {}

    def tokenize() -> None:
        result["resp"] = httpx.post(limited_server.url + "/tokenize", headers=AUTH,
                                    json={"prompt": text}, timeout=120)

    thread = threading.Thread(target=tokenize)
    latencies = []
    with httpx.Client() as client:  # one connection: the probe's own cost stays out
        thread.start()
        while thread.is_alive():
            start = time.monotonic()
            assert client.get(limited_server.url + "/health", timeout=10).status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)
    thread.join()
    resp = result["resp"]
    assert resp.status_code == 200
    assert resp.json()["count"] == len(tok.encode(text))
    # Blocked, /health waited the whole tokenization (seconds); off the loop it waits for the
    # interpreter lock at most. The bounds are loose for a CPU shared with other work.
    latencies.sort()
    assert len(latencies) >= 5, latencies
    assert latencies[len(latencies) // 2] < 0.1 and latencies[-1] < 2.0, latencies


def test_long_prompt_is_refused_before_tokenizing(limited_server):
    text = "hello " * (2**20)  # 6 MB of text: far past max_model_len whatever the tokenizer
    for path, body, param in (
            ("/v1/completions", {"prompt": text}, "prompt"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]},
             "messages")):
        start = time.monotonic()
        resp = httpx.post(limited_server.url + path, headers=AUTH, timeout=60,
                          json={"model": MODEL_NAME, "max_tokens": 1, **body})
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == param and str(MAX_MODEL_LEN) in err["message"]
        assert time.monotonic() - start < 5.0


BAD_TEXT = [("lone high surrogate", "hi \ud800 x", 400), ("lone low surrogate", "\udfff", 400),
            ("NUL", "a\x00b", 200), ("control characters", "\x01\x07\x1b[31m\x7f", 200),
            ("mixed scripts", "Привет 你好 مرحبا 👋🏽 e\u0301", 200)]


@pytest.mark.parametrize("name,text,status", BAD_TEXT, ids=[c[0] for c in BAD_TEXT])
def test_any_text_is_200_or_400_naming_the_field(limited_server, name, text, status):
    url = limited_server.url
    cases = [("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]},
              "messages.0.content"),
             ("/v1/completions", {"prompt": text}, "prompt"),
             ("/v1/completions", {"prompt": "hi", "stop": [text]}, "stop.0"),
             ("/tokenize", {"prompt": text}, "prompt"),
             ("/tokenize", {"messages": [{"role": "user", "content": text}]},
              "messages.0.content")]
    for path, body, param in cases:
        if path != "/tokenize":
            body = {"model": MODEL_NAME, "max_tokens": 2, **body}
        resp = raw_post(url + path, body, headers=AUTH)
        assert resp.status_code == status, (path, body, resp.text)
        if status == 400:
            assert resp.json()["error"]["param"] == param, resp.json()


def test_plain_request_dropped_by_its_client(limited_server):
    """A non-streaming client that leaves is aborted quietly: its blocks come back, and the
    log holds no traceback (collect_final once read the result of a cancelled task)."""
    body = json.dumps({"model": MODEL_NAME, "prompt": "Hello", "max_tokens": MAX_MODEL_LEN - 8,
                       "ignore_eos": True, "n": 4}).encode()
    # A raw socket closed right after the request: the client leaves however fast the engine is
    # (an HTTP client's short timeout stopped leaving once the CPU decode got faster).
    url = httpx.URL(limited_server.url)
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     + f"Authorization: {AUTH['Authorization']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body)
        time.sleep(0.05)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page = httpx.get(limited_server.url + "/metrics", headers=AUTH, timeout=10).text
        if metric(page, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.2)
    assert metric(page, "vllm:num_kv_cache_blocks_free") == metric(
        page, "vllm:num_kv_cache_blocks_total")
    log = limited_server.log(tail=10**6)
    assert "InvalidStateError" not in log and "Traceback" not in log, log[-3000:]


RAW_BODIES = [("invalid UTF-8", b'{"prompt": "\xff\xfe abc"}'),
              ("deep JSON", b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
              ("truncated JSON", b'{"prompt": "abc'), ("not an object", b'"abc"')]


@pytest.mark.parametrize("name,raw", RAW_BODIES, ids=[c[0] for c in RAW_BODIES])
def test_malformed_bodies_are_400(limited_server, name, raw):
    for path in ("/v1/completions", "/tokenize"):
        resp = httpx.post(limited_server.url + path, content=raw, timeout=30,
                          headers={**AUTH, "content-type": "application/json"})
        assert resp.status_code == 400, (path, resp.text)
        assert resp.json()["error"]["code"] == 400
