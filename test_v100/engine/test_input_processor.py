"""InputProcessor: the checks and tokenization that LLMEngine.add_request and the engine core
process's client share; every bad input is a ValueError naming the field and what is allowed."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_volta.engine.input_processor import InputProcessor
from vllm_volta.sampling_params import SamplingParams

CONFIG = SimpleNamespace(max_model_len=8, max_logprobs=5, get_vocab_size=lambda: 100)


class WordTokenizer:
    """Each word's length as its id: a reference simple enough to check by eye."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


def test_prompt_forms_give_text_and_ids():
    inputs = InputProcessor(CONFIG, WordTokenizer())
    params = SamplingParams(max_tokens=3)
    assert inputs.process("a bb ccc", params) == ("a bb ccc", [1, 2, 3], params)
    assert inputs.process((4, 5), params)[:2] == (None, [4, 5])
    assert inputs.process({"prompt": "dd"}, params)[:2] == ("dd", [2])
    assert inputs.process({"prompt": "x", "prompt_token_ids": [9]}, params)[:2] == ("x", [9])
    text, ids, default = inputs.process([1], None)
    assert isinstance(default, SamplingParams) and ids == [1] and text is None


@pytest.mark.parametrize("prompt, params, message", [
    ([], None, "must not be empty"),
    (list(range(1, 10)), None, "exceeds max_model_len 8"),
    ([1, 100], None, r"token id 100 is outside the vocabulary \[0, 100\)"),
    ([1, -1], None, "token id -1"),
    ([True, 2], None, "prompt must be a string, a list of token ids or a dict"),
    ({"text": "a"}, None, "'prompt' or 'prompt_token_ids'"),
    ([1], SamplingParams(logprobs=6), r"logprobs=6 exceeds max_logprobs=5; allowed range is \[0, 5\]"),
    ([1], SamplingParams(prompt_logprobs=9), "prompt_logprobs=9 exceeds max_logprobs=5"),
    ([1], {"max_tokens": 3}, "params must be SamplingParams or PoolingParams, got dict"),
])
def test_bad_input_names_the_field(prompt, params, message):
    with pytest.raises(ValueError, match=message):
        InputProcessor(CONFIG, WordTokenizer()).process(prompt, params)


def test_text_and_stop_strings_need_a_tokenizer():
    inputs = InputProcessor(CONFIG, None)
    with pytest.raises(ValueError, match="text prompts need a tokenizer"):
        inputs.process("hello", None)
    with pytest.raises(ValueError, match="stop strings need a tokenizer; use stop_token_ids"):
        inputs.process([1, 2], SamplingParams(stop=["x"]))
    assert inputs.process([1, 2], SamplingParams(stop_token_ids=[2]))[1] == [1, 2]
