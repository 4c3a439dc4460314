"""The server process: info routes, tokenization, API key, --chat-template, 64 concurrent
streams with queueing, and KV blocks coming back after a client disconnects."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from test_v100.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL_NAME, SERVER_ARGS
from test_v100.entrypoints.openai.utils import RemoteServer, metric
from vllm_volta.entrypoints.openai.api_server import engine_process_choice

CUSTOM_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_health_version_models(server):
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    import vllm_volta

    assert httpx.get(server.url + "/version", timeout=10).json() == {
        "version": vllm_volta.__version__}
    models = server.client().models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].model_extra["max_model_len"] == MAX_MODEL_LEN


def test_tokenize_detokenize(server, hf_reference):
    tok, _ = hf_reference
    text = "Hello world, hello server!"
    body = httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=10).json()
    assert body["tokens"] == tok.encode(text)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_MODEL_LEN
    assert body["token_strs"] is None
    strs = httpx.post(server.url + "/tokenize", timeout=10,
                      json={"prompt": text, "return_token_strs": True}).json()["token_strs"]
    assert strs == tok.convert_ids_to_tokens(body["tokens"])
    back = httpx.post(server.url + "/detokenize", json={"tokens": body["tokens"]}, timeout=10)
    assert back.json() == {"prompt": text}
    msgs = [{"role": "user", "content": "hi"}]
    chat = httpx.post(server.url + "/tokenize", json={"messages": msgs}, timeout=10).json()
    assert chat["tokens"] == tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def keyed_server(tiny_model, tmp_path_factory):
    template = tmp_path_factory.mktemp("tmpl") / "template.jinja"
    template.write_text(CUSTOM_TEMPLATE)
    args = ["--model", tiny_model, *SERVER_ARGS, "--api-key", "sk-test",
            "--chat-template", str(template)]
    with RemoteServer(args) as srv:
        yield srv


def test_api_key(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="wrong").models.list()
    resp = httpx.get(keyed_server.url + "/v1/models", timeout=10)  # no key at all
    assert resp.status_code == 401 and resp.json()["error"]["code"] == 401
    assert [m.id for m in keyed_server.client(api_key="sk-test").models.list()] == [MODEL_NAME]
    assert httpx.get(keyed_server.url + "/health", timeout=10).status_code == 200


def test_chat_template_flag(keyed_server, hf_reference):
    tok, _ = hf_reference
    msgs = [{"role": "user", "content": "Hello"}]
    rendered = "[user] Hello\n[assistant] "
    body = httpx.post(keyed_server.url + "/tokenize", json={"messages": msgs}, timeout=10,
                      headers={"Authorization": "Bearer sk-test"})
    assert body.json()["tokens"] == tok.encode(rendered)
    resp = keyed_server.client(api_key="sk-test").chat.completions.create(
        model=MODEL_NAME, messages=msgs, max_tokens=1)
    assert resp.usage.prompt_tokens == len(tok.encode(rendered))


def test_64_concurrent_streams(server):
    """All 64 streams finish with exactly their token count while /health stays up; with
    max_num_seqs=16 most of them wait in the scheduler's queue first."""

    async def one(client, i: int) -> tuple[int, int, str]:
        max_tokens = 3 + i % 6
        stream = await client.completions.create(
            model=MODEL_NAME, prompt=f"Hello {i} world", max_tokens=max_tokens,
            temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, usage, reasons = "", None, []
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                if c.finish_reason:
                    reasons.append(c.finish_reason)
            usage = chunk.usage or usage
        assert reasons == ["length"]
        return max_tokens, usage.completion_tokens, text

    async def health_probe(stop: asyncio.Event) -> list[int]:
        codes = []
        async with httpx.AsyncClient(timeout=30) as http:
            while not stop.is_set():
                codes.append((await http.get(server.url + "/health")).status_code)
                await asyncio.sleep(0.2)
        return codes

    async def main():
        client = server.async_client(timeout=300)
        stop = asyncio.Event()
        probe = asyncio.create_task(health_probe(stop))
        results = await asyncio.gather(*(one(client, i) for i in range(64)))
        stop.set()
        return results, await probe

    results, codes = asyncio.run(main())
    assert len(results) == 64
    for wanted, got, text in results:
        assert got == wanted and text
    assert codes and all(c == 200 for c in codes)


def _wait_idle(server, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        page = httpx.get(server.url + "/metrics", timeout=10).text
        idle = metric(page, "vllm:num_requests_running") == 0 and \
            metric(page, "vllm:num_requests_waiting") == 0
        if idle or time.monotonic() > deadline:
            return page
        time.sleep(0.1)


def test_disconnect_frees_kv_blocks(server):
    before = _wait_idle(server)
    total = metric(before, "vllm:num_kv_cache_blocks_total")
    assert metric(before, "vllm:num_kv_cache_blocks_free") == total
    gen_before = metric(before, "vllm:generation_tokens_total")
    body = {"model": MODEL_NAME, "prompt": "Hello world " * 8, "max_tokens": 100,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few events, then hang up
        assert any(line.startswith("data: ") for line in got)
        busy = httpx.get(server.url + "/metrics", timeout=10).text
        assert metric(busy, "vllm:num_kv_cache_blocks_free") < total
        assert metric(busy, "vllm:kv_cache_usage_perc") > 0
    after = _wait_idle(server)
    assert metric(after, "vllm:num_kv_cache_blocks_free") == total
    assert metric(after, "vllm:kv_cache_usage_perc") == 0
    # Aborted long before its 100 tokens.
    assert metric(after, "vllm:generation_tokens_total") - gen_before < 100


def test_non_streaming_disconnect_aborts(server):
    before = _wait_idle(server)
    total = metric(before, "vllm:num_kv_cache_blocks_total")
    gen_before = metric(before, "vllm:generation_tokens_total")
    n, max_tokens = 8, MAX_MODEL_LEN - 8
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": max_tokens,
            "ignore_eos": True, "n": n}

    async def hang_up_once_running() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            request = asyncio.create_task(http.post(server.url + "/v1/completions", json=body))
            while True:  # wait until the engine is generating for us, then go away
                page = (await http.get(server.url + "/metrics")).text
                if metric(page, "vllm:num_requests_running") > 0 or request.done():
                    break
                await asyncio.sleep(0.01)
            assert not request.done(), "request finished before the client could hang up"
            request.cancel()

    asyncio.run(hang_up_once_running())
    after = _wait_idle(server)
    assert metric(after, "vllm:num_kv_cache_blocks_free") == total
    assert metric(after, "vllm:generation_tokens_total") - gen_before < n * max_tokens


def test_http_stack_uses_uvloop_and_httptools_where_installed(server, monkeypatch):
    from vllm_volta.entrypoints.openai import api_server

    # The package depends on both, so the server runs on them and says so.
    assert api_server.http_stack() == ("uvloop", "httptools")
    assert "uvicorn with the uvloop event loop and the httptools HTTP parser" in server.log(100_000)
    found = {"uvloop": None, "httptools": object()}
    monkeypatch.setattr(api_server.importlib.util, "find_spec", lambda name: found[name])
    assert api_server.http_stack() == ("asyncio", "httptools")
    found["httptools"] = None
    assert api_server.http_stack() == ("asyncio", "h11")


def test_server_logs_where_the_engine_runs(server):
    """Both server kinds of the fixture: the log names where the engine core runs and why,
    and the engine's stats reach /metrics (from the core process too)."""
    log = server.log(100_000)
    if "--engine-process" in server.args:
        assert "Engine core in a process of its own (--engine-process)" in log
        assert "Engine core running in process" in log
    else:
        assert "Engine core in the server process (--no-engine-process)" in log
    page = httpx.get(server.url + "/metrics", timeout=10).text
    assert metric(page, "vllm:num_kv_cache_blocks_total") > 0


def test_engine_process_default_follows_the_device():
    assert engine_process_choice(None, "cuda")[0] is True
    assert engine_process_choice(None, "cpu")[0] is False
    assert engine_process_choice(False, "cuda") == (False, "--no-engine-process")
    assert engine_process_choice(True, "cpu") == (True, "--engine-process")
