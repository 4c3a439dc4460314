"""SamplingParams: vLLM's defaults, normalization, validation and helpers."""

from __future__ import annotations

import pytest

from vllm_volta.sampling_params import MAX_LOGPROBS, SamplingParams, SamplingType


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.seed, p.logprobs, p.prompt_logprobs) == \
        (16, 0, None, None, None)
    assert p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    assert p.skip_special_tokens and p.spaces_between_special_tokens and p.detokenize
    assert not p.include_stop_str_in_output
    assert p.sampling_type == SamplingType.RANDOM


def test_normalization() -> None:
    p = SamplingParams(stop="###", top_k=-1, seed=-1, logprobs=True, stop_token_ids=(7, 8))
    assert p.stop == ["###"] and p.top_k == 0 and p.seed is None and p.logprobs == 0
    assert p.stop_token_ids == [7, 8]
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_greedy_resets_filters_and_sampling_types() -> None:
    g = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert g.sampling_type == SamplingType.GREEDY
    assert (g.top_p, g.top_k, g.min_p) == (1.0, 0, 0.0)
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED


def test_tiny_temperature_is_raised() -> None:
    assert SamplingParams(temperature=1e-4).temperature == pytest.approx(1e-2)


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 0}, "n"),
    ({"n": 1.5}, "n"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"),
    ({"stop": "x", "detokenize": False}, "stop"),
    ({"temperature": "hot"}, "temperature"),
    ({"seed": 1.5}, "seed"),
])
def test_invalid_values_raise_value_error_naming_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_boundaries_are_accepted() -> None:
    SamplingParams(top_p=1.0, min_p=1.0, presence_penalty=-2, frequency_penalty=2,
                   logprobs=MAX_LOGPROBS, prompt_logprobs=0, min_tokens=16, top_k=1,
                   temperature=0)


def test_stop_tokens_and_eos() -> None:
    p = SamplingParams(stop_token_ids=[5])
    p.update_from_tokenizer(2)
    assert p.all_stop_token_ids == {2, 5} and p.eos_token_ids == {2}
    assert p.is_stop_token(5) and p.is_stop_token(2) and not p.is_stop_token(3)
    q = SamplingParams(ignore_eos=True)
    q.update_from_tokenizer([2, 9])
    # eos still counts for min_tokens masking, but does not stop generation.
    assert q.all_stop_token_ids == {2, 9}
    assert not q.is_stop_token(2)
    p.update_from_tokenizer(None)
    assert p.all_stop_token_ids == {2, 5}


def test_output_text_buffer_length() -> None:
    assert SamplingParams(stop=["a", "abcd"]).output_text_buffer_length == 3
    assert SamplingParams(stop=["abcd"], include_stop_str_in_output=True
                          ).output_text_buffer_length == 0
    assert SamplingParams().output_text_buffer_length == 0


def test_clone_is_deep() -> None:
    p = SamplingParams(stop=["x"], stop_token_ids=[1])
    p.update_from_tokenizer(2)
    c = p.clone()
    c.stop.append("y")
    c.update_from_tokenizer(3)
    c.stop_token_ids.append(7)
    assert p.stop == ["x"] and p.stop_token_ids == [1] and p.all_stop_token_ids == {1, 2}
    assert c.all_stop_token_ids == {1, 2, 3}
    assert p.clone() == p and p.clone().eos_token_ids is not p.eos_token_ids


def test_repr_names_fields() -> None:
    r = repr(SamplingParams(temperature=0.5, stop="z"))
    assert r.startswith("SamplingParams(n=1,") and "temperature=0.5" in r and "stop=['z']" in r


def test_logit_bias_and_allowed_token_ids_checks():
    assert SamplingParams(logit_bias={"12": -1, 3: 2}).logit_bias == {12: -1.0, 3: 2.0}
    cases = [({"logit_bias": {"a": 1}}, "logit_bias keys must be token ids"),
             ({"logit_bias": {-1: 1}}, "logit_bias key must be a non-negative token id"),
             ({"logit_bias": {1: float("nan")}}, "logit_bias value must be a finite number"),
             ({"logit_bias": {1: "x"}}, "logit_bias value must be a number"),
             ({"logit_bias": [1]}, "logit_bias must be a mapping"),
             ({"allowed_token_ids": []}, "allowed_token_ids must not be empty"),
             ({"allowed_token_ids": [2, -1]}, "allowed_token_ids must be non-negative")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            SamplingParams(**kwargs)
    params = SamplingParams(logit_bias={1: 1.0}, allowed_token_ids=[1, 2])
    clone = params.clone()
    clone.logit_bias[5] = 1.0
    clone.allowed_token_ids.append(3)
    assert params.logit_bias == {1: 1.0} and params.allowed_token_ids == [1, 2]
