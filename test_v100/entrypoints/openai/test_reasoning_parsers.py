"""The reasoning parsers (qwen3, deepseek_r1): whole outputs, and streams cut anywhere add up to
the same reasoning and content."""

from __future__ import annotations

import random

import pytest

from vllm_volta.entrypoints.openai.reasoning_parsers import (REASONING_PARSERS, DeepSeekR1ReasoningParser,
                                                             Qwen3ReasoningParser, ReasoningStream)

QWEN3, R1 = Qwen3ReasoningParser(), DeepSeekR1ReasoningParser()


@pytest.mark.parametrize("parser,text,want", [
    (QWEN3, "<think>\nLet me add.\n</think>\n\nIt is 4.", ("\nLet me add.\n", "\n\nIt is 4.")),
    (QWEN3, "It is 4.", (None, "It is 4.")),  # thinking off: no block
    (QWEN3, "<think>cut by max_tokens", ("cut by max_tokens", None)),
    (QWEN3, "<think>x</think>", ("x", None)),
    (QWEN3, "Not <think>a block</think> here", (None, "Not <think>a block</think> here")),
    (QWEN3, "", (None, None)),
    (R1, "Let me add.</think>It is 4.", ("Let me add.", "It is 4.")),  # <think> was in the prompt
    (R1, "<think>Let me add.</think>It is 4.", ("Let me add.", "It is 4.")),
    (R1, "still thinking", ("still thinking", None)),
])
def test_split(parser, text, want):
    assert parser.split(text) == want


@pytest.mark.parametrize("parser,text", [
    (QWEN3, "<think>\nLet me add: 2 + 2.\n</think>\n\nIt is <b>4</b>."),
    (QWEN3, "Plain <thin answer"), (QWEN3, "<think>never closed"),
    (R1, "<think>Let me add.</think>It is 4. </thi"), (R1, "Only reasoning <")])
@pytest.mark.parametrize("seed", range(10))
def test_any_stream_split_gives_the_whole_outputs_result(parser, text, seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, len(text) - 1))) + [len(text)]
    stream, reasoning, content = ReasoningStream(parser), "", ""
    for cut in cuts:
        r, c = stream.feed(text[:cut], final=cut == len(text))
        reasoning, content = reasoning + r, content + c
        assert "<think>" not in reasoning and "</think" not in reasoning
        assert stream.content == content
    want_reasoning, want_content = parser.split(text)
    assert (reasoning, content) == (want_reasoning or "", want_content or "")


def test_parsers_by_name():
    assert sorted(REASONING_PARSERS) == ["deepseek_r1", "gemma4", "qwen3"]
