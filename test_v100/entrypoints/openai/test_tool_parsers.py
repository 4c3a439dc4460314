"""The hermes tool-call parser: whole outputs, and streams cut at every kind of boundary give
the same content and calls."""

from __future__ import annotations

import json
import random

import pytest

from vllm_volta.entrypoints.openai.tool_parsers import HermesToolParser, StreamingToolCalls

PARSER = HermesToolParser()
TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
             '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_extract():
    content, calls = PARSER.extract(TWO_CALLS)
    assert content == "Let me check.\n"
    assert _calls(calls) == [("get_weather", {"city": "Paris", "unit": "c"}), ("now", {})]
    assert len({c.id for c in calls}) == 2 and calls[0].id.startswith("chatcmpl-tool-")
    assert PARSER.extract("plain text") == ("plain text", [])
    # Only calls: no content. An unclosed last call (max_tokens cut the closing tag) still counts.
    content, calls = PARSER.extract('<tool_call>{"name": "f", "arguments": {"x": [1, 2]}}')
    assert content is None and _calls(calls) == [("f", {"x": [1, 2]})]
    # Non-ASCII arguments stay readable.
    assert PARSER.extract('<tool_call>{"name": "f", "arguments": {"q": "café"}}</tool_call>')[1][0].arguments \
        == '{"q": "café"}'


@pytest.mark.parametrize("text", ['<tool_call>{"name": "f", "arguments": {</tool_call>',
                                  '<tool_call>["f"]</tool_call>', '<tool_call>{"arguments": {}}</tool_call>'])
def test_a_block_that_is_no_call_is_content(text):
    assert PARSER.extract("Hi " + text) == ("Hi " + text, [])


@pytest.mark.parametrize("seed", range(20))
def test_any_stream_split_gives_the_whole_outputs_result(seed):
    rng = random.Random(seed)
    text = TWO_CALLS if seed % 2 else "No tools needed: the answer is <tool_c... no, 42."
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30))) + [len(text)]
    stream, content, calls = StreamingToolCalls(PARSER), "", []
    for cut in cuts:
        delta, new = stream.feed(text[:cut], final=cut == len(text))
        content += delta
        calls += new
        # Nothing is sent that could still turn out to be part of a tag.
        assert "<tool_call" not in content
    want_content, want_calls = PARSER.extract(text)
    assert content == (want_content or "") and _calls(calls) == _calls(want_calls)
    assert stream.num_calls == len(want_calls)


def test_stream_holds_back_a_partial_tag_and_sends_a_bad_block_as_content():
    stream = StreamingToolCalls(PARSER)
    assert stream.feed("Sure <tool_") == ("Sure ", [])
    assert stream.feed("Sure <tool_call>{oops}") == ("", [])
    assert stream.feed("Sure <tool_call>{oops}</tool_call>", final=True) == ("<tool_call>{oops}</tool_call>", [])
