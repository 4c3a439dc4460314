"""SamplingMetadata.build: batched tensors and the flags that select the sampler's fast paths."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.sample.metadata import SamplingMetadata, make_generator
from vllm_volta.sampling_params import SamplingParams


def _build(params, outputs=None, prompts=None, generators=None) -> SamplingMetadata:
    outputs = outputs if outputs is not None else [[] for _ in params]
    return SamplingMetadata.build(params, output_token_ids=outputs, prompt_token_ids=prompts,
                                  generators=generators)


def test_all_greedy_default_batch_needs_nothing() -> None:
    m = _build([SamplingParams(temperature=0), SamplingParams(temperature=0, top_p=0.3)])
    assert m.all_greedy and not m.all_random
    assert m.temperature is None and m.greedy_mask is None
    assert m.no_top_p and m.no_top_k and m.no_min_p and m.no_penalties
    assert m.output_token_ids is None and m.min_tokens_rows is None
    assert m.max_num_logprobs is None and m.generators == {}


def test_mixed_batch_tensors() -> None:
    gen = make_generator(7)
    params = [SamplingParams(temperature=0, logprobs=3),
              SamplingParams(temperature=0.5, top_p=0.9, top_k=4, min_p=0.1, seed=7,
                             logprobs=5),
              SamplingParams(temperature=1.5, presence_penalty=0.5)]
    m = _build(params, outputs=[[1], [2, 3], []], generators=[None, gen, None])
    assert not m.all_greedy and not m.all_random
    torch.testing.assert_close(m.temperature, torch.tensor([1.0, 0.5, 1.5]))
    assert m.greedy_mask.tolist() == [True, False, False]
    torch.testing.assert_close(m.top_p, torch.tensor([1.0, 0.9, 1.0]))
    assert m.top_k.tolist() == [0, 4, 0] and m.max_top_k == 4
    torch.testing.assert_close(m.min_p, torch.tensor([0.0, 0.1, 0.0]))
    assert m.generators == {1: gen}
    assert m.max_num_logprobs == 5
    assert not m.no_penalties
    torch.testing.assert_close(m.presence_penalties, torch.tensor([0.0, 0.0, 0.5]))
    assert m.output_token_ids.tolist() == [[1, -1], [2, 3], [-1, -1]]
    # Repetition penalty unused: prompt ids are not needed.
    assert m.prompt_token_ids is None


def test_repetition_penalty_needs_prompt_ids() -> None:
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams()]
    with pytest.raises(ValueError, match="prompt_token_ids"):
        _build(params)
    m = _build(params, prompts=[[4, 5, 6], [7]])
    assert m.prompt_token_ids.tolist() == [[4, 5, 6], [7, -1, -1]]


def test_min_tokens_pairs_only_while_unmet() -> None:
    a = SamplingParams(min_tokens=2, stop_token_ids=[9])
    a.update_from_tokenizer(1)
    b = SamplingParams(min_tokens=1)
    b.update_from_tokenizer(1)
    m = _build([a, b], outputs=[[5], [5]])
    pairs = sorted(zip(m.min_tokens_rows.tolist(), m.min_tokens_token_ids.tolist()))
    assert pairs == [(0, 1), (0, 9)]
    assert _build([a], outputs=[[5, 6]]).min_tokens_rows is None


def test_seeded_row_without_generator_is_an_error() -> None:
    with pytest.raises(ValueError, match="generator"):
        _build([SamplingParams(seed=1)])


def test_row_count_mismatch() -> None:
    with pytest.raises(ValueError, match="output_token_ids"):
        SamplingMetadata.build([SamplingParams()], output_token_ids=[[], []])


def test_make_generator_child_streams() -> None:
    ref = torch.Generator().manual_seed(123)
    child0 = make_generator(123, 0)
    assert torch.equal(torch.rand(8, generator=child0), torch.rand(8, generator=ref))
    c1 = torch.rand(8, generator=make_generator(123, 1))
    c1_again = torch.rand(8, generator=make_generator(123, 1))
    c2 = torch.rand(8, generator=make_generator(123, 2))
    assert torch.equal(c1, c1_again) and not torch.equal(c1, c2)
    assert not torch.equal(c1, torch.rand(8, generator=make_generator(123, 0)))
