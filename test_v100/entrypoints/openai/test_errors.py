"""Every user error is an OpenAI-shaped 4xx, never a 500, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from test_v100.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL_NAME

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "hello " * (MAX_MODEL_LEN + 10)

# (name, path, body, status, param that must be named, or None for "any")
CASES = [
    ("negative max_tokens", CMPL, {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
    ("chat negative max_tokens", CHAT, {"messages": MSGS, "max_tokens": -5}, 400, "max_tokens"),
    ("negative temperature", CMPL, {"prompt": "a", "temperature": -0.1}, 400, "temperature"),
    ("top_p zero", CMPL, {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("top_p above one", CHAT, {"messages": MSGS, "top_p": 1.5}, 400, "top_p"),
    ("n zero", CMPL, {"prompt": "a", "n": 0}, 400, "n"),
    ("logprobs too many", CMPL, {"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    ("top_logprobs too many", CHAT, {"messages": MSGS, "logprobs": True, "top_logprobs": 21},
     400, "top_logprobs"),
    ("missing messages", CHAT, {"max_tokens": 3}, 400, "messages"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("missing prompt", CMPL, {"max_tokens": 3}, 400, "prompt"),
    ("prompt + max_tokens too long", CMPL, {"prompt": "hello " * 40, "max_tokens": MAX_MODEL_LEN},
     400, "max_tokens"),
    ("prompt alone too long", CHAT, {"messages": [{"role": "user", "content": LONG_PROMPT}]},
     400, None),
    ("token id out of vocab", CMPL, {"prompt": [1, 2, 10**9]}, 400, "prompt"),
    ("negative token id", CMPL, {"prompt": [[5, -1]]}, 400, "prompt"),
    ("empty prompt list", CMPL, {"prompt": []}, 400, "prompt"),
    ("image content part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, None),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("stream_options without stream", CMPL, {"prompt": "a", "stream_options":
                                            {"include_usage": True}}, 400, None),
    ("min_tokens above max_tokens", CMPL, {"prompt": "a", "max_tokens": 2, "min_tokens": 5},
     400, "min_tokens"),
    ("wrong type", CMPL, {"prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
    ("logit_bias above 100", CMPL, {"prompt": "a", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("logit_bias key not an id", CHAT, {"messages": MSGS, "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("logit_bias id out of vocab", CMPL, {"prompt": "a", "logit_bias": {"100000": 1}}, 400,
     "logit_bias"),
    ("empty allowed_token_ids", CMPL, {"prompt": "a", "allowed_token_ids": []}, 400,
     "allowed_token_ids"),
    ("unknown response_format", CHAT, {"messages": MSGS, "response_format": {"type": "yaml"}}, 400,
     "response_format"),
    ("json_schema without a schema", CMPL, {"prompt": "a", "response_format": {"type": "json_schema"}},
     400, "response_format"),
    ("two kinds of structured output", CMPL, {"prompt": "a", "guided_regex": "a+",
                                              "response_format": {"type": "json_object"}}, 400, None),
    ("structured_outputs with two fields", CMPL, {"prompt": "a", "structured_outputs":
                                                  {"regex": "a", "choice": ["b"]}}, 400, "structured_outputs"),
    ("regex that does not compile", CHAT, {"messages": MSGS, "guided_regex": "(unclosed"}, 400,
     "structured_outputs"),
    ("chat json_schema without a schema", CHAT, {"messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}}, 400, "response_format"),
    ("regex with an anchor inside", CHAT, {"messages": MSGS, "guided_regex": "a^b"}, 400,
     "structured_outputs"),
    ("regex no text matches", CMPL, {"prompt": "a", "guided_regex": "[^\\x00-\\U0010FFFF]"}, 400,
     "structured_outputs"),
    ("grammar that never completes", CMPL, {"prompt": "a", "guided_grammar": 'root ::= root "a"'},
     400, "structured_outputs"),
    ("json schema keyword the grammar ignores", CHAT, {"messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "integer"}}}}},
     400, "structured_outputs"),
    ("tools without --enable-auto-tool-choice", CHAT,
     {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice"),
    ("tool without a name", CHAT, {"messages": MSGS, "tools": [{"type": "function", "function": {}}],
                                   "tool_choice": "none"}, 400, "tools.0.function"),
    ("tool call arguments not JSON", CHAT, {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]}, 400, None),
    ("unknown model", CMPL, {"prompt": "a", "model": "gpt-17"}, 404, "model"),
    ("chat unknown model", CHAT, {"messages": MSGS, "model": "nope"}, 404, "model"),
]


def _check_error(resp: httpx.Response, status: int, param: str | None) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["message"]
    if param is not None:
        assert err["param"] == param, err


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_invalid_request(server, name, path, body, status, param):
    resp = httpx.post(server.url + path, json={"model": MODEL_NAME, **body}
                      if "model" not in body else body, timeout=30)
    _check_error(resp, status, param)


@pytest.mark.parametrize("path", [CMPL, CHAT, "/tokenize"])
@pytest.mark.parametrize("payload", [b"{not json", b"[1, 2]", b""])
def test_malformed_body(server, path, payload):
    resp = httpx.post(server.url + path, content=payload, timeout=30,
                      headers={"content-type": "application/json"})
    _check_error(resp, 400, None)


def test_unknown_route_is_openai_shaped(server):
    _check_error(httpx.get(server.url + "/v1/nothing", timeout=10), 404, None)


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="a", temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=MSGS)


def test_streaming_errors_are_reported_before_the_stream(client):
    # Validation happens before any event is sent, so a stream fails like a plain call.
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="a", max_tokens=-1, stream=True)


def test_server_still_serves_after_errors(server, client):
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    resp = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2,
                                     extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 2
