"""Request schemas: prompt forms, vLLM extras mapped onto SamplingParams, validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vllm_volta.entrypoints.openai.protocol import (
    ChatCompletionRequest, CompletionRequest, TokenizeRequest)
from vllm_volta.sampling_params import SamplingParams


@pytest.mark.parametrize("prompt,expected", [
    ("hi", ["hi"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_prompt_forms(prompt, expected):
    assert CompletionRequest(prompt=prompt).prompts() == expected


def test_sampling_kwargs_build_sampling_params():
    req = CompletionRequest(prompt="x", n=2, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1,
                            seed=3, stop="END", presence_penalty=0.5,
                            frequency_penalty=-0.5, repetition_penalty=1.1, ignore_eos=True,
                            min_tokens=2, stop_token_ids=[7])
    params = SamplingParams(max_tokens=4, **req.sampling_kwargs())
    assert (params.n, params.temperature, params.top_p, params.top_k, params.min_p) == \
        (2, 0.5, 0.9, 5, 0.1)
    assert (params.seed, params.stop, params.stop_token_ids) == (3, ["END"], [7])
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == \
        (0.5, -0.5, 1.1)
    assert params.ignore_eos and params.min_tokens == 2
    # Unset fields keep SamplingParams' own defaults.
    default = SamplingParams()
    plain = SamplingParams(**CompletionRequest(prompt="x").sampling_kwargs())
    assert (plain.temperature, plain.top_p, plain.top_k) == \
        (default.temperature, default.top_p, default.top_k)


def test_chat_max_completion_tokens_wins_and_parts_join():
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}],
        max_tokens=9, max_completion_tokens=4)
    assert req.max_new_tokens == 4
    assert req.messages[0].text() == "a\nb"
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "x"}],
                                 max_tokens=9).max_new_tokens == 9


@pytest.mark.parametrize("kwargs,field", [
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0.0}, "top_p"),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, None),
])
def test_completion_validation(kwargs, field):
    with pytest.raises(ValidationError) as info:
        CompletionRequest(**kwargs)
    if field is not None:
        assert info.value.errors()[0]["loc"][0] == field


def test_chat_and_tokenize_validation():
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[])
    with pytest.raises(ValidationError):  # top_logprobs needs logprobs
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(ValidationError):  # neither prompt nor messages
        TokenizeRequest()
    with pytest.raises(ValidationError):  # both
        TokenizeRequest(prompt="x", messages=[{"role": "user", "content": "x"}])
