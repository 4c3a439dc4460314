"""Helpers of serving_engine.py that need no server: the stream chunk encoder, sampling defaults."""
from __future__ import annotations

import json

import pytest

from vllm_volta.entrypoints.openai.serving_engine import ChunkEncoder, sse


@pytest.mark.parametrize("fields", [
    {"choices": [{"index": 0, "text": " héllo \"wörld\"\n", "logprobs": None,
                  "finish_reason": None, "stop_reason": None}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
])
def test_chunks_equal_the_whole_dict_as_one_event(fields):
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "m/ü"}
    event = ChunkEncoder(head)(**fields)
    assert event == sse({**head, **fields})
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[len("data: "):]) == {**head, **fields}


def test_chunk_encoder_needs_a_head():
    with pytest.raises(ValueError, match="repeated fields"):
        ChunkEncoder({})


def test_model_sampling_defaults_fill_only_unset_fields():
    """--generation-config auto: the model's recommendations for what a request leaves unset;
    its max_new_tokens bounds the default max_tokens."""
    from types import SimpleNamespace

    from vllm_volta.entrypoints.openai.serving_engine import OpenAIServing

    recommended = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 30}
    config = SimpleNamespace(get_diff_sampling_param=lambda: dict(recommended))
    engine = SimpleNamespace(get_tokenizer=lambda: None, model_config=config)
    handler = OpenAIServing(engine, ["m"], max_model_len=100, vocab_size=10)
    params = handler.make_sampling_params(temperature=0.0, max_tokens=5)
    assert (params.temperature, params.max_tokens) == (0.0, 5)  # the request's own
    params = handler.make_sampling_params(seed=1)
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.8, 20)
    assert handler.resolve_max_tokens(90, None) == 10 and handler.resolve_max_tokens(10, None) == 30
    plain = OpenAIServing(SimpleNamespace(get_tokenizer=lambda: None), ["m"], max_model_len=100,
                          vocab_size=10)
    assert plain.make_sampling_params().temperature == 1.0 and plain.resolve_max_tokens(10, None) == 90
