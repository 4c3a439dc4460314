"""/v1/embeddings through a real server and the official openai client (float and base64, which
the client asks for by default and decodes), against transformers' last_hidden_state."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from test_v100.entrypoints.openai.conftest import MODEL_NAME


def _reference(model, ids, dimensions=None):
    with torch.no_grad():
        vec = model.model(torch.tensor([ids])).last_hidden_state[0, -1].double()
    vec = vec[:dimensions] if dimensions else vec
    return vec / vec.norm()


@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_embeddings_match_transformers(client, hf_reference, encoding_format):
    tok, model = hf_reference
    texts = ["Hello world, the", "The quick brown fox jumps"]
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    resp = client.embeddings.create(model=MODEL_NAME, input=texts, **kwargs)
    assert resp.model == MODEL_NAME and [d.index for d in resp.data] == [0, 1]
    ids = [tok.encode(t) for t in texts]
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == sum(map(len, ids))
    for d, prompt_ids in zip(resp.data, ids):
        vec = d.embedding  # the client decodes base64 itself when it chose the format (None)
        if encoding_format == "base64":
            vec = np.frombuffer(base64.b64decode(vec), dtype="<f4").tolist()
        torch.testing.assert_close(torch.tensor(vec, dtype=torch.float64), _reference(model, prompt_ids),
                                   atol=1e-5, rtol=1e-4)


def test_token_ids_and_dimensions(client, hf_reference):
    tok, model = hf_reference
    ids = tok.encode("Hello world, the")
    resp = client.embeddings.create(model=MODEL_NAME, input=[ids, ids[:3]], dimensions=8)
    for d, prompt_ids in zip(resp.data, (ids, ids[:3])):
        assert len(d.embedding) == 8
        torch.testing.assert_close(torch.tensor(d.embedding, dtype=torch.float64),
                                   _reference(model, prompt_ids, dimensions=8), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": "hi", "dimensions": 0}, "dimensions"),
    ({"input": "hi", "dimensions": 100000}, "dimensions"),
    ({"input": [[5, 100000]]}, "prompt"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
])
def test_bad_requests_are_400_and_the_server_keeps_serving(server, client, body, param):
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": MODEL_NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert len(client.embeddings.create(model=MODEL_NAME, input="ok").data) == 1
