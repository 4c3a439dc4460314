"""Structured outputs (xgrammar): the bitmask against a dense reference, and the engine's outputs
matching their JSON schema, regex or choices (greedy and sampled, with async scheduling too)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from test_v100.worker.tiny_models import random_prompts, save_tiny_model
from vllm_volta import LLM
from vllm_volta.sampling_params import SamplingParams, StructuredOutputsParams
from vllm_volta.sample.token_bias import apply_bitmask

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "color"],
          "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}}}


def test_apply_bitmask_matches_a_dense_mask():
    torch.manual_seed(0)
    vocab = 70  # three 32-bit words, the last partly used
    allowed = torch.rand(2, vocab) < 0.3
    bits = torch.zeros(2, 3, dtype=torch.int64)
    for r, t in allowed.nonzero().tolist():
        bits[r, t // 32] |= 1 << (t % 32)
    bitmask = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)  # as int32 words
    logits = torch.randn(4, vocab)
    want = logits.clone()
    want[[1, 3]] = torch.where(allowed, logits[[1, 3]], float("-inf"))
    got = apply_bitmask(logits.clone(), torch.tensor([1, 3]), bitmask)
    assert torch.equal(got, want)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("structured")
    save_tiny_model(path, "llama", with_tokenizer=True)
    return LLM(str(path), cpu_kvcache_space=0.01, max_model_len=128)


def _texts(llm, kind, temperature=0.0, n=1):
    params = SamplingParams(temperature=temperature, max_tokens=60, n=n, seed=1,
                            structured_outputs=StructuredOutputsParams(**kind))
    outs = llm.generate(random_prompts(4, 3, 12, seed=2), params, use_tqdm=False)
    return [c for o in outs for c in o.outputs]


@pytest.mark.parametrize("temperature,n", [(0.0, 1), (1.0, 2)])
def test_choice_regex_and_json_schema(llm, temperature, n):
    for c in _texts(llm, {"choice": ["yes, really", "no"]}, temperature, n):
        assert c.text in ("yes, really", "no") and c.finish_reason == "stop"
    for c in _texts(llm, {"regex": r"[a-c]{2}-[0-9]{3}"}, temperature, n):
        assert re.fullmatch(r"[a-c]{2}-[0-9]{3}", c.text), c.text
    for c in _texts(llm, {"json": SCHEMA}, temperature, n):
        value = json.loads(c.text)
        assert set(value) == {"ok", "color"} and isinstance(value["ok"], bool)
        assert value["color"] in ("red", "green", "blue") and c.finish_reason == "stop"


def test_async_scheduling_and_a_plain_request_alongside(tmp_path):
    """With async scheduling the engine waits for each constrained token before the next step;
    a plain request in the same batch gives the tokens it gives alone."""
    save_tiny_model(tmp_path, "llama", with_tokenizer=True)
    llm = LLM(str(tmp_path), cpu_kvcache_space=0.01, max_model_len=128, async_scheduling=True)
    prompts = random_prompts(2, 4, 8, seed=5)
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=40,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    mixed = llm.generate(prompts, [constrained, plain], use_tqdm=False)
    assert set(json.loads(mixed[0].outputs[0].text)) == {"ok", "color"}
    alone = llm.generate([prompts[1]], plain, use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone[0].outputs[0].token_ids


def test_bad_grammars_fail_alone(llm):
    outs = llm.generate(["hi", "there"], [
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed")),
        SamplingParams(temperature=0, max_tokens=3)], use_tqdm=False)
    assert outs[0].error.startswith("structured_outputs: ") and outs[1].error is None
    with pytest.raises(ValueError, match="structured_outputs must set exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
