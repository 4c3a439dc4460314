"""The reasoning parsers (qwen3, deepseek_r1): whole outputs, and streams cut anywhere add up to
the same reasoning and content."""

from __future__ import annotations

import random

import pytest

from vllm_volta.entrypoints.openai.reasoning_parsers import (REASONING_PARSERS, DeepSeekR1ReasoningParser,
                                                             Gemma4ReasoningParser, Qwen3ReasoningParser,
                                                             ReasoningStream, bind_prompt)

QWEN3, R1, GEMMA4 = Qwen3ReasoningParser(), DeepSeekR1ReasoningParser(), Gemma4ReasoningParser()
# Qwen3.5 with thinking on: its prompt opened <think>; with thinking off it closed an empty block.
QWEN35_ON = QWEN3.for_prompt("<|im_start|>assistant\n<think>\n")
QWEN35_OFF = QWEN3.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n")
# Gemma 4 templates: thinking off may close an empty channel in the prompt; a thought cue opens one.
GEMMA4_CUED = GEMMA4.for_prompt("<|turn>model\n<|channel>thought\n")
GEMMA4_OFF = GEMMA4.for_prompt("<|turn>model\n<|channel>thought\n<channel|>")


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
    # qwen3 also reads Qwen3.5's shape: the block was opened in the prompt.
    (QWEN3, "Let me add.\n</think>\n\nIt is 4.", ("Let me add.\n", "\n\nIt is 4.")),
    (QWEN3, "</think>It is 4.", (None, "It is 4.")),
    (QWEN35_ON, "Let me add.</think>It is 4.", ("Let me add.", "It is 4.")),
    (QWEN35_ON, "cut by max_tokens", ("cut by max_tokens", None)),
    (QWEN35_OFF, "It is 4.", (None, "It is 4.")),
    (QWEN35_OFF, "<think>x</think>y", ("x", "y")),
    (GEMMA4, "<|channel>thought\nLet me add.<channel|>It is 4.", ("Let me add.", "It is 4.")),
    (GEMMA4, "It is 4.", (None, "It is 4.")),  # thinking off: no channel
    (GEMMA4, "<|channel>thought\ncut by max_tokens", ("cut by max_tokens", None)),
    (GEMMA4, "<|channel>thought\nI need the weather.<|tool_call>call:f{}<tool_call|>",
     ("I need the weather.", "<|tool_call>call:f{}<tool_call|>")),  # a call ends the thinking
    (GEMMA4, "<|channel>thought\n<channel|>", (None, None)),
    (GEMMA4, "Not <|channel>a channel<channel|>", (None, "Not <|channel>a channel<channel|>")),
    (GEMMA4_CUED, "Let me add.<channel|>It is 4.", ("Let me add.", "It is 4.")),
    (GEMMA4_CUED, "Weather.<|tool_call>call:f{}<tool_call|>", ("Weather.", "<|tool_call>call:f{}<tool_call|>")),
    (GEMMA4_OFF, "It is 4.", (None, "It is 4.")),
])
def test_split(parser, text, want):
    assert parser.split(text) == want


@pytest.mark.parametrize("parser,text", [
    (QWEN3, "<think>\nLet me add: 2 + 2.\n</think>\n\nIt is <b>4</b>."),
    (QWEN3, "Plain <thin answer"), (QWEN3, "<think>never closed"),
    (R1, "<think>Let me add.</think>It is 4. </thi"), (R1, "Only reasoning <"),
    (QWEN3, "Let me add.\n</think>\n\nIt is 4."), (QWEN3, "Plain answer with a </thi"),
    (QWEN3, "A <think> in prose, then </think>"),
    (QWEN35_ON, "Let me add.\n</think>\n\nIt is 4."), (QWEN35_ON, "Never closed <"),
    (QWEN35_OFF, "It is <think>4</think>."),
    (GEMMA4, "<|channel>thought\nLet me add.<channel|>It is 4."), (GEMMA4, "<|channel>thou"),
    (GEMMA4, "<|channel>thought\nWeather.<|tool_call>call:f{}<tool_call|>"), (GEMMA4, "<|chan plain"),
    (GEMMA4, "<|channel>thoughts without the label<channel|>x"),
    (GEMMA4_CUED, "Let me add.<channel|>It is 4."), (GEMMA4_CUED, "thought\nLabelled.<channel|>It is 4."),
    (GEMMA4_OFF, "It is <b>4</b>.")])
@pytest.mark.parametrize("seed", range(10))
def test_any_stream_split_gives_the_whole_outputs_result(parser, text, seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, len(text) - 1))) + [len(text)]
    stream, reasoning, content = ReasoningStream(parser), "", ""
    for cut in cuts:
        r, c = stream.feed(text[:cut], final=cut == len(text))
        reasoning, content = reasoning + r, content + c
        assert "<think>" not in reasoning and "</think" not in reasoning and "<channel|" not in reasoning
        assert stream.content == content
    want_reasoning, want_content = parser.split(text)
    assert (reasoning, content) == (want_reasoning or "", want_content or "")


def test_parsers_by_name():
    assert sorted(REASONING_PARSERS) == ["deepseek_r1", "gemma4", "qwen3"]


def test_streams_send_as_soon_as_the_shape_is_known():
    """Outputs that open their block, and Qwen3.5 outputs whose prompt says how they start,
    stream at once; a qwen3 output of unknown start waits for </think> or its end."""
    for parser, text, want in [
            (QWEN3, "<think>Adding", ("Adding", "")), (QWEN35_ON, "Adding", ("Adding", "")),
            (QWEN35_OFF, "It is", ("", "It is")), (QWEN3, "Adding", ("", "")),
            (QWEN3, "Adding</think>It", ("Adding", "It")), (GEMMA4, "<|channel>thought\nAdd", ("Add", "")),
            (GEMMA4, "<|channel>thought", ("", "")), (GEMMA4, "It is", ("", "It is")),
            (GEMMA4_CUED, "Adding", ("Adding", "")), (GEMMA4_OFF, "It is", ("", "It is"))]:
        assert ReasoningStream(parser).feed(text) == want, (text, want)


def test_bind_prompt_reads_the_end_of_the_prompt():
    class Tokenizer:
        def decode(self, ids):
            return "".join(ids)

    assert bind_prompt(QWEN3, Tokenizer(), ["<|im_start|>", "assistant", "\n", "<think>", "\n"]).opened is True
    assert bind_prompt(QWEN3, Tokenizer(), ["<think>", "\n\n", "</think>", "\n\n"]).opened is False
    assert bind_prompt(QWEN3, Tokenizer(), ["<|im_start|>", "assistant", "\n"]).opened is None
    assert bind_prompt(R1, Tokenizer(), ["<think>"]) is R1
    assert bind_prompt(GEMMA4, Tokenizer(), ["<|turn>", "model\n", "<|channel>", "thought", "\n"]).opened is True
    assert bind_prompt(GEMMA4, Tokenizer(), ["<|channel>", "thought\n", "<channel|>"]).opened is False
    assert GEMMA4.keeps_special_tokens and not getattr(QWEN3, "keeps_special_tokens", False)
