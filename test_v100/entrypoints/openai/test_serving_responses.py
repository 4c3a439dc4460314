"""/v1/responses through a real server and the official openai client (its Response and stream
event types), against transformers' greedy continuation of the same chat prompt."""

from __future__ import annotations

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MODEL_NAME
from test_v100.entrypoints.openai.utils import hf_greedy

EXACT = {"ignore_eos": True}


def _reference(tok, model, messages, n):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return ids, tok.decode(hf_greedy(model, ids, n), skip_special_tokens=True)


def test_text_matches_transformers(client, hf_reference):
    tok, model = hf_reference
    resp = client.responses.create(model=MODEL_NAME, input="Hello world, the", instructions="Be brief.",
                                   max_output_tokens=9, temperature=0.0, extra_body=EXACT)
    ids, want = _reference(tok, model, [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hello world, the"}], 9)
    assert resp.output_text == want and resp.model == MODEL_NAME
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.input_tokens == len(ids) and resp.usage.output_tokens == 9
    assert resp.output[0].role == "assistant" and resp.output[0].content[0].type == "output_text"


def test_message_list_input_and_stream(client, hf_reference):
    tok, model = hf_reference
    items = [{"role": "user", "content": [{"type": "input_text", "text": "The quick brown"}]},
             {"role": "assistant", "content": "fox"}, {"role": "user", "content": "jumps"}]
    _, want = _reference(tok, model, [{"role": "user", "content": "The quick brown"},
                                      {"role": "assistant", "content": "fox"},
                                      {"role": "user", "content": "jumps"}], 7)
    events = list(client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=7, temperature=0.0,
                                          stream=True, extra_body=EXACT))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == want == events[-1].response.output_text


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "tools": [{"type": "function", "name": "f"}]}, "tools"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": []}, "input"),
])
def test_unsupported_or_bad_fields_are_400(server, body, param):
    r = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL_NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
