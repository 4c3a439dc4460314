"""/v1/chat/completions through a real server and the official openai client."""

from __future__ import annotations

import json

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MODEL_NAME
from test_v100.entrypoints.openai.utils import hf_greedy, hf_logprobs

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France?"}]
EXACT = {"ignore_eos": True}


def _chat(client, messages=MESSAGES, **kwargs):
    kwargs.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                          temperature=0.0, extra_body=EXACT, **kwargs)


def _template_ids(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def test_chat_matches_transformers(client, hf_reference):
    tok, model = hf_reference
    prompt_ids = _template_ids(tok, MESSAGES)
    resp = _chat(client, max_tokens=10)
    ref = hf_greedy(model, prompt_ids, 10)
    (choice,) = resp.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == tok.decode(ref, skip_special_tokens=True)
    assert choice.finish_reason == "length"
    assert resp.object == "chat.completion"
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.usage.completion_tokens == 10


def test_content_parts_and_multi_turn(client, hf_reference):
    tok, _ = hf_reference
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                          {"type": "text", "text": "world"}]}]
    joined = [{"role": "user", "content": "Hello\nworld"}]
    assert _chat(client, parts).choices[0].message.content == \
        _chat(client, joined).choices[0].message.content
    turns = MESSAGES + [{"role": "assistant", "content": "Paris."},
                        {"role": "user", "content": "And Spain?"}]
    resp = _chat(client, turns, max_tokens=2)
    assert resp.usage.prompt_tokens == len(_template_ids(tok, turns))


def test_max_completion_tokens(client):
    assert _chat(client, max_tokens=3).usage.completion_tokens == 3
    resp = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0,
                                          max_completion_tokens=5, extra_body=EXACT)
    assert resp.usage.completion_tokens == 5


def test_logprobs_and_top_logprobs(client, hf_reference):
    tok, model = hf_reference
    prompt_ids = _template_ids(tok, MESSAGES)
    resp = _chat(client, max_tokens=5, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    ref_ids = hf_greedy(model, prompt_ids, 5)
    ref = hf_logprobs(model, prompt_ids, ref_ids)
    assert len(content) == 5
    for i, (entry, tid) in enumerate(zip(content, ref_ids)):
        assert entry.logprob == pytest.approx(ref[len(prompt_ids) - 1 + i][tid], abs=2e-3)
        assert entry.bytes == list(entry.token.encode("utf-8"))
        tops = entry.top_logprobs
        assert len(tops) == 3
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert tops[0].token == entry.token  # greedy picks the top token
    no_top = _chat(client, max_tokens=2, logprobs=True)
    assert all(e.top_logprobs == [] for e in no_top.choices[0].logprobs.content)
    assert _chat(client, max_tokens=2).choices[0].logprobs is None


def test_stream_order_and_usage(client):
    expected = _chat(client, max_tokens=7).choices[0].message.content
    chunks = list(_chat(client, max_tokens=7, stream=True,
                        stream_options={"include_usage": True}))
    first, *rest = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.object == "chat.completion.chunk"
    content = "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert content == expected
    finish = [c for c in rest if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert finish[0].choices[0].delta.content is None
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7
    assert chunks.index(finish[0]) == len(chunks) - 2  # finish, then usage


def test_stream_n_two(client):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, n=2, temperature=1.0,
                  seed=3, extra_body=EXACT)
    reference = client.chat.completions.create(**kwargs)
    texts = {0: "", 1: ""}
    roles = set()
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            if c.delta.role:
                roles.add(c.index)
            texts[c.index] += c.delta.content or ""
    assert roles == {0, 1}
    assert texts == {c.index: c.message.content for c in reference.choices}


def test_stream_raw_sse(server):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_return_token_ids_match_transformers(client, hf_reference):
    """vLLM's return_token_ids on chat: the choice's generated ids (per chunk when streaming)
    and the response's prompt ids (on the first chunk), equal to transformers' tokens."""
    tok, model = hf_reference
    prompt_ids = _template_ids(tok, MESSAGES)
    ref = hf_greedy(model, prompt_ids, 7)
    with_ids = {**EXACT, "return_token_ids": True}
    resp = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=7,
                                          temperature=0.0, extra_body=with_ids)
    assert resp.choices[0].model_extra["token_ids"] == ref
    assert resp.model_extra["prompt_token_ids"] == prompt_ids
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES,
                                                 max_tokens=7, temperature=0.0, stream=True,
                                                 extra_body=with_ids))
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in c.model_extra for c in chunks[1:])
    assert [t for c in chunks for ch in c.choices for t in ch.model_extra["token_ids"]] == ref
    plain = _chat(client, max_tokens=2)
    assert "prompt_token_ids" not in (plain.model_extra or {})
    assert "token_ids" not in (plain.choices[0].model_extra or {})


def test_structured_outputs(client):
    """OpenAI's response_format (json_schema, json_object) and vLLM's guided_choice and
    structured_outputs: the content follows them (streamed too)."""
    # The test tokenizer has no '"' (its alphabet is its corpus's): a schema without strings.
    schema = {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}
    fmt = {"type": "json_schema", "json_schema": {"name": "flags", "schema": schema}}
    for temperature in (0.0, 1.0):
        resp = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=40,
                                              temperature=temperature, response_format=fmt)
        value = json.loads(resp.choices[0].message.content)
        assert 1 <= len(value) <= 3 and all(isinstance(v, bool) for v in value)
        assert resp.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=40,
                                            response_format=fmt, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(isinstance(v, bool) for v in json.loads(streamed))
    choice = client.completions.create(model=MODEL_NAME, prompt="Pick:", max_tokens=10, temperature=1.0,
                                       n=3, seed=3, extra_body={"guided_choice": ["left", "right"]})
    assert all(c.text in ("left", "right") for c in choice.choices)
    regex = client.completions.create(model=MODEL_NAME, prompt="Code:", max_tokens=10,
                                      extra_body={"structured_outputs": {"regex": "[A-F]{4}"}})
    assert len(regex.choices[0].text) == 4 and set(regex.choices[0].text) <= set("ABCDEF")
    # Any JSON value: whatever came out is JSON once the object closed.
    obj = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=60,
                                         temperature=0.0, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        json.loads(obj.choices[0].message.content)
