"""/v1/completions through a real server and the official openai client, checked against
transformers on the same random-weight model."""

from __future__ import annotations

import json

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MODEL_NAME
from test_v100.entrypoints.openai.utils import hf_greedy, hf_logprobs

PROMPT = "Hello world, the"
EXACT = {"ignore_eos": True}  # vLLM extra: generate exactly max_tokens


def _greedy(client, prompt, max_tokens=10, **kwargs):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens,
                                     temperature=0.0, extra_body=EXACT, **kwargs)


def test_greedy_text_and_usage_match_transformers(client, hf_reference):
    tok, model = hf_reference
    prompt_ids = tok.encode(PROMPT)
    resp = _greedy(client, PROMPT, max_tokens=12)
    ref = hf_greedy(model, prompt_ids, 12)
    (choice,) = resp.choices
    assert choice.text == tok.decode(ref, skip_special_tokens=True)
    assert choice.finish_reason == "length"
    assert resp.model == MODEL_NAME and resp.object == "text_completion"
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.usage.completion_tokens == 12
    assert resp.usage.total_tokens == len(prompt_ids) + 12


def test_prompt_forms_agree(client, hf_reference):
    tok, _ = hf_reference
    other = "The quick brown"
    single = _greedy(client, PROMPT).choices[0].text
    single_other = _greedy(client, other).choices[0].text
    as_ids = _greedy(client, tok.encode(PROMPT)).choices[0].text
    batch = _greedy(client, [PROMPT, other])
    batch_ids = _greedy(client, [tok.encode(PROMPT), tok.encode(other)])
    assert as_ids == single
    for resp in (batch, batch_ids):
        assert [c.index for c in resp.choices] == [0, 1]
        assert [c.text for c in resp.choices] == [single, single_other]
        assert resp.usage.prompt_tokens == len(tok.encode(PROMPT)) + len(tok.encode(other))
        assert resp.usage.completion_tokens == 20


def test_n_seeded_sampling_is_reproducible(client):
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, n=3, temperature=1.0,
                  seed=1234, extra_body=EXACT)
    first = client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert first.usage.completion_tokens == 24
    # Three samples of 8 tokens from a near-uniform model: not all identical.
    assert len({c.text for c in first.choices}) > 1


def test_stop_string_truncates(client):
    full = _greedy(client, PROMPT, max_tokens=24).choices[0].text
    stop = next(full[i:i + 2] for i in range(3, len(full) - 2) if full[i:i + 2].strip())
    cut = full.index(stop)
    resp = _greedy(client, PROMPT, max_tokens=24, stop=[stop])
    (choice,) = resp.choices
    assert choice.text == full[:cut]
    assert choice.finish_reason == "stop"
    assert choice.model_extra.get("stop_reason") == stop


def test_logprobs_match_transformers(client, hf_reference):
    tok, model = hf_reference
    prompt_ids = tok.encode(PROMPT)
    resp = _greedy(client, PROMPT, max_tokens=6, logprobs=3)
    lp = resp.choices[0].logprobs
    ref_ids = hf_greedy(model, prompt_ids, 6)
    ref = hf_logprobs(model, prompt_ids, ref_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == resp.choices[0].text
    for i, tid in enumerate(ref_ids):
        row = ref[len(prompt_ids) - 1 + i]
        assert lp.token_logprobs[i] == pytest.approx(row[tid], abs=2e-3)
        assert 1 <= len(lp.top_logprobs[i]) <= 4
        # Greedy: the chosen token has the highest logprob of the listed ones.
        assert lp.token_logprobs[i] == pytest.approx(max(lp.top_logprobs[i].values()), abs=1e-5)
    offsets = lp.text_offset
    assert offsets[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], lp.tokens))


def test_logit_bias_and_allowed_token_ids(client, hf_reference):
    """OpenAI's logit_bias (string keys, as JSON has them) steers greedy decoding as
    transformers' sequence_bias does; vLLM's allowed_token_ids keeps every token in the set."""
    import torch
    from transformers import GenerationConfig

    tok, model = hf_reference
    prompt_ids = tok.encode(PROMPT)
    plain = hf_greedy(model, prompt_ids, 6)
    bias = {plain[0]: -5.0, plain[2]: -5.0}
    config = GenerationConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False,
                              pad_token_id=model.config.pad_token_id,
                              sequence_bias=[[[t], b] for t, b in bias.items()])
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt_ids]), generation_config=config)[0, len(prompt_ids):]
    extra = {**EXACT, "return_token_ids": True}
    resp = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0.0,
                                     logit_bias={str(t): b for t, b in bias.items()}, extra_body=extra)
    assert want.tolist() != plain and resp.choices[0].token_ids == want.tolist()
    allowed = sorted(set(plain[:3]) | {7, 42})
    resp = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0.0,
                                     extra_body={**extra, "allowed_token_ids": allowed})
    assert set(resp.choices[0].token_ids) <= set(allowed)


def test_echo_with_prompt_logprobs(client, hf_reference):
    tok, model = hf_reference
    prompt_ids = tok.encode(PROMPT)
    resp = _greedy(client, PROMPT, max_tokens=3, echo=True, logprobs=1)
    choice = resp.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 3
    assert lp.token_logprobs[0] is None  # nothing predicts the first prompt token
    ref = hf_logprobs(model, prompt_ids, [])
    for i in range(1, len(prompt_ids)):
        assert lp.token_logprobs[i] == pytest.approx(ref[i - 1][prompt_ids[i]], abs=2e-3)
    plain = _greedy(client, PROMPT, max_tokens=3, echo=True)
    assert plain.choices[0].text == PROMPT + _greedy(client, PROMPT, 3).choices[0].text


def test_stream_matches_non_stream(client):
    expected = _greedy(client, PROMPT, max_tokens=10).choices[0].text
    chunks = list(_greedy(client, PROMPT, max_tokens=10, stream=True,
                          stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == expected
    finishes = [c.choices[0].finish_reason for c in text_chunks if c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert text_chunks[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 10


def test_stream_n_and_logprobs(client):
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, n=2, temperature=0.8,
                  seed=7, logprobs=2, extra_body=EXACT)
    reference = client.completions.create(**kwargs)
    texts, tokens = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] += c.text
            tokens[c.index] += c.logprobs.tokens
    for c in reference.choices:
        assert texts[c.index] == c.text
        assert tokens[c.index] == c.logprobs.tokens


def test_stream_ends_with_done(server):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all("choices" in json.loads(e) for e in events[:-1])


def test_return_token_ids_match_transformers(client, hf_reference):
    """vLLM's return_token_ids: the generated ids (per chunk when streaming) and the prompt's
    ids, equal to transformers' greedy tokens; without it neither field is sent."""
    tok, model = hf_reference
    prompt_ids = tok.encode(PROMPT)
    ref = hf_greedy(model, prompt_ids, 9)
    with_ids = {**EXACT, "return_token_ids": True}
    (choice,) = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=9,
                                          temperature=0.0, extra_body=with_ids).choices
    assert choice.model_extra["token_ids"] == ref
    assert choice.model_extra["prompt_token_ids"] == prompt_ids
    chunks = [c for c in client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=9, temperature=0.0, stream=True,
        extra_body=with_ids) if c.choices]
    assert [t for c in chunks for t in c.choices[0].model_extra["token_ids"]] == ref
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in c.choices[0].model_extra for c in chunks[1:])
    plain = _greedy(client, PROMPT, max_tokens=3).choices[0]
    assert "token_ids" not in (plain.model_extra or {})


def test_prompt_logprobs_match_transformers(client, hf_reference):
    """vLLM's prompt_logprobs extra: per prompt token after the first, its logprob (and the
    top ones) under the model, as transformers computes them; null for the first."""
    tok, model = hf_reference
    prompt_ids = tok.encode(PROMPT)
    resp = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0.0,
                                     extra_body={"prompt_logprobs": 2})
    got = resp.choices[0].model_extra["prompt_logprobs"]
    ref = hf_logprobs(model, prompt_ids, [])
    assert len(got) == len(prompt_ids) and got[0] is None
    for i, entry in enumerate(got[1:], start=1):
        row = ref[i - 1]
        assert entry[str(prompt_ids[i])]["logprob"] == pytest.approx(row[prompt_ids[i]], abs=2e-3)
        top = sorted(range(len(row)), key=row.__getitem__, reverse=True)[:2]
        assert {int(t) for t in entry} == set(top) | {prompt_ids[i]}
        for t, lp in entry.items():
            assert lp["rank"] == 1 + sum(v > row[int(t)] for v in row)


def test_prompt_logprobs_checks(server):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2}
    streamed = httpx.post(server.url + "/v1/completions", timeout=30,
                          json={**body, "stream": True, "prompt_logprobs": 1})
    too_many = httpx.post(server.url + "/v1/completions", timeout=30, json={**body, "prompt_logprobs": 99})
    assert streamed.status_code == too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "prompt_logprobs"
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None and all(len(e) == 1 for e in chat["prompt_logprobs"][1:])
