"""Helpers of serving_engine.py that need no server: the stream chunk encoder."""
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
