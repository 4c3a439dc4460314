"""The tool-call parsers (hermes, llama3_json, pythonic, mistral): whole outputs, and streams cut at every kind of
boundary give the same content and calls."""

from __future__ import annotations

import json
import random

import pytest

from vllm_volta.entrypoints.openai.tool_parsers import (TOOL_PARSERS, HermesToolParser, Llama3JsonToolParser,
                                                        MistralToolParser, PythonicToolParser, StreamingToolCalls)

PARSER = HermesToolParser()
LLAMA = Llama3JsonToolParser()
PYTHONIC = PythonicToolParser()
MISTRAL = MistralToolParser()
MISTRAL_V3 = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]'
MISTRAL_V11 = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}'
LLAMA_CALLS = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "now", "parameters": {}}')
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


def test_llama3_json():
    content, calls = LLAMA.extract(LLAMA_CALLS)
    assert content is None
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("now", {})]
    assert _calls(LLAMA.extract(' {"name": "f", "arguments": {"x": 1}}\n')[1]) == [("f", {"x": 1})]
    for text in ("The answer is {42}.", '{"name": "f", "parameters": {}} and more text',
                 '{"name": "f", "parameters": [1]}', '{"parameters": {}}', "{not json"):
        assert LLAMA.extract(text) == (text, [])


@pytest.mark.parametrize("parser,text", [
    (PARSER, TWO_CALLS), (PARSER, "No tools needed: the answer is <tool_c... no, 42."),
    (LLAMA, LLAMA_CALLS), (LLAMA, '  {"name": "f", "parameters": {"q": "x"}}'),
    (LLAMA, "Plain answer { with a brace"), (LLAMA, "<|python_ta and then plain text"),
    (PYTHONIC, '[get_weather(city="Paris", days=3), now()]'), (PYTHONIC, "Plain [1] answer"),
    (MISTRAL, MISTRAL_V3), (MISTRAL, MISTRAL_V11), (MISTRAL, "[TOOLS are not calls"), (MISTRAL, "Plain answer")])
@pytest.mark.parametrize("seed", range(8))
def test_any_stream_split_gives_the_whole_outputs_result(parser, text, seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30)))) + [len(text)]
    stream, content, calls = parser.streamer(), "", []
    for cut in cuts:
        delta, new = stream.feed(text[:cut], final=cut == len(text))
        content += delta
        calls += new
        # Nothing is sent that could still turn out to be part of a tag or a call.
        assert "<tool_call" not in content and not content.lstrip().startswith("{")
    want_content, want_calls = parser.extract(text)
    assert content == (want_content or "") and _calls(calls) == _calls(want_calls)
    assert stream.num_calls == len(want_calls)


def test_pythonic():
    content, calls = PYTHONIC.extract(' [get_weather(city="Paris", days=3), now()]\n')
    assert content is None and _calls(calls) == [("get_weather", {"city": "Paris", "days": 3}), ("now", {})]
    for text in ("Hello", "[f(1)]", '[f(x=open("a"))]', "[f(**kw)]", "[]", "[f(x=1)] and text"):
        assert PYTHONIC.extract(text) == (text, [])


def test_mistral():
    for text in (MISTRAL_V3, MISTRAL_V11, " " + MISTRAL_V3 + "\n"):
        content, calls = MISTRAL.extract(text)
        assert content is None and _calls(calls) == [("get_weather", {"city": "Paris"}), ("now", {})]
    content, calls = MISTRAL.extract('Sure. [TOOL_CALLS][{"name": "f", "arguments": {"q": "café"}}]')
    assert content == "Sure. " and calls[0].arguments == '{"q": "café"}'
    for text in ("Plain", "[TOOL_CALLS]", "[TOOL_CALLS] [1, 2]", "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS][ARGS]{}",
                 '[TOOL_CALLS] [{"name": "f", "arguments": {}} trailing'):
        assert MISTRAL.extract(text) == (text, [])
    assert MISTRAL.keeps_special_tokens  # the marker is a special token


def test_parsers_by_name():
    assert sorted(TOOL_PARSERS) == ["gemma4", "hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder"]
    assert isinstance(PARSER.streamer(), StreamingToolCalls)


def test_stream_holds_back_a_partial_tag_and_sends_a_bad_block_as_content():
    stream = StreamingToolCalls(PARSER)
    assert stream.feed("Sure <tool_") == ("Sure ", [])
    assert stream.feed("Sure <tool_call>{oops}") == ("", [])
    assert stream.feed("Sure <tool_call>{oops}</tool_call>", final=True) == ("<tool_call>{oops}</tool_call>", [])


def test_forced_call_readers():
    from vllm_volta.entrypoints.openai.tool_parsers import NamedToolCall, RequiredToolCalls
    named = NamedToolCall("f")
    assert _calls(named.extract('{"x": 1}')[1]) == [("f", {"x": 1})]
    assert named.extract('{"x": ') == ('{"x": ', [])  # cut short by max_tokens: plain content
    required = RequiredToolCalls()
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    assert _calls(required.extract(text)[1]) == [("f", {"a": 1}), ("g", {})]
    assert required.extract('{"name": "f"}')[1] == []
    stream = required.streamer()
    assert stream.feed(text[:10]) == ("", []) and len(stream.feed(text, final=True)[1]) == 2
