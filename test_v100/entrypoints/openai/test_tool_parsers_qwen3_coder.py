"""The qwen3_coder tool-call parser (Qwen3-Coder / Qwen3-Next / Qwen3.5 XML calls): whole outputs,
values typed by the request's schema, malformed and cut-short blocks, and streams cut anywhere
that add up to the whole output's result."""

from __future__ import annotations

import json

import pytest

from test_v100.entrypoints.openai.tool_stream_checks import check_stream_matches_whole, stream_pieces
from vllm_volta.entrypoints.openai.tool_parsers import TOOL_PARSERS, bind_tools

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
    "metric": {"type": "boolean"}, "hours": {"type": "array"}, "where": {"type": "object"},
    "note": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
PARSER = bind_tools(TOOL_PARSERS["qwen3_coder"](), TOOLS)


def _block(name: str, **params: str) -> str:
    """A call as Qwen3.5's template writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


TWO_CALLS = ("Let me check.\n\n" + _block("get_weather", city="Paris", days="3", temp="-2.5", metric="true",
                                          hours='[9, 12]', where='{"lat": 48.85, "lon": 2.35}', note="null")
             + "\n" + _block("now"))


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_whole_output_with_typed_values():
    content, calls = PARSER.extract(TWO_CALLS)
    assert content == "Let me check.\n\n"
    assert _calls(calls) == [
        ("get_weather", {"city": "Paris", "days": 3, "temp": -2.5, "metric": True, "hours": [9, 12],
                         "where": {"lat": 48.85, "lon": 2.35}, "note": None}),
        ("now", {})]
    assert calls[0].id != calls[1].id
    # The arguments text is what json.dumps writes (non-ASCII kept readable).
    assert calls[0].arguments == json.dumps(json.loads(calls[0].arguments), ensure_ascii=False)
    assert PARSER.extract(_block("get_weather", city="Zürich"))[1][0].arguments == '{"city": "Zürich"}'


def test_values_stay_text_where_the_schema_says_so_or_is_silent():
    # A string parameter keeps digits and inner newlines; an undeclared parameter, an unknown
    # tool and a request without tools keep text; a value that is not of its type stays text.
    text = _block("get_weather", city="10\nDowning St", extra="42", days="three", metric="yes", hours="[1,")
    assert _calls(PARSER.extract(text)[1]) == [("get_weather", {
        "city": "10\nDowning St", "extra": "42", "days": "three", "metric": "yes", "hours": "[1,"})]
    assert _calls(PARSER.extract(_block("other", days="3"))[1]) == [("other", {"days": "3"})]
    untyped = TOOL_PARSERS["qwen3_coder"]()
    assert _calls(untyped.extract(_block("get_weather", days="3"))[1]) == [("get_weather", {"days": "3"})]


def test_layout_variants():
    # No newlines around values; a missing </parameter> ends at the next tag (as vLLM reads it);
    # no text before the call means no content; a missing </tool_call> at the end is fine.
    text = "<tool_call><function=get_weather><parameter=city>Rome<parameter=days>\n2\n</function>"
    content, calls = PARSER.extract(text)
    assert content is None and _calls(calls) == [("get_weather", {"city": "Rome", "days": 2})]
    # Without <tool_call> (Qwen3-Coder sometimes leaves it out) the function tag starts a call.
    content, calls = PARSER.extract("Sure.\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>")
    assert content == "Sure.\n" and _calls(calls) == [("get_weather", {"days": 2})]
    # A repeated parameter keeps its first value (a stream cannot take back what it sent).
    assert _calls(PARSER.extract(_block("now") .replace("</function>", "<parameter=a>\n1\n</parameter>"
                                                        "<parameter=a>\n2\n</parameter></function>"))[1]) \
        == [("now", {"a": "1"})]


@pytest.mark.parametrize("text", [
    "Plain answer, no call.",
    "Use <tool_call> tags.",                                   # a tag in prose, never a call
    "<tool_call>\n{\"name\": \"now\"}\n</tool_call>",          # hermes JSON is not this format
    "<tool_call>\n<function=bad name>\n</function>\n</tool_call>",
    "Hi <tool_call>\n<function=get_wea",                       # cut before the name is complete
    "<tool_call>\n",
    "Write <function=a b> or <function=> or <function=",  # bare tags whose names are no names
])
def test_no_call_is_content(text):
    assert PARSER.extract(text) == (text, [])


def test_cut_short_call_keeps_complete_parameters():
    text = _block("get_weather", city="Paris", days="3")
    cut = text[:text.index("3\n</parameter>") + 1]  # the days value may still have been growing
    content, calls = PARSER.extract(cut)
    assert content is None and _calls(calls) == [("get_weather", {"city": "Paris"})]


def test_a_bad_block_after_a_call_is_content():
    bad = "<tool_call>\noops\n</tool_call>"
    content, calls = PARSER.extract(_block("now") + "\n" + bad + " trailing <function=no name>")
    assert content == bad and _calls(calls) == [("now", {})]


@pytest.mark.parametrize("text", [
    TWO_CALLS, _block("now"), "Plain answer <tool_ without a call", "  \n" + _block("get_weather", city="Oslo"),
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",  # cut short
    "Hi <tool_call>\nnot a call\n</tool_call> and " + _block("get_weather", days="1") + " after",
    "<tool_call><function=get_weather><parameter=city>Rome<parameter=days>2</function><tool_call><function=now>",
    "Bare <function=x y> tag, then <function=get_weather>\n<parameter=days>\n4\n</parameter>\n</function>",
    _block("now") + "<function=get_weather><parameter=city>Oslo</parameter></function><function=bad name>",
])
@pytest.mark.parametrize("seed", range(12))
def test_any_stream_split_gives_the_whole_outputs_result(text, seed):
    check_stream_matches_whole(PARSER, text, seed)


def test_stream_sends_the_name_first_then_each_argument():
    text = _block("get_weather", city="Paris", days="3")
    seen = []
    stream = PARSER.streamer()
    for cut in range(1, len(text) + 1):
        _, deltas = stream.feed(text[:cut], final=cut == len(text))
        seen += [(text[:cut], d.to_dict()) for d in deltas]
    (at, first), *rest = seen
    assert at.endswith("<function=get_weather>") and first["function"] == {"name": "get_weather", "arguments": "{"}
    assert [d["function"]["arguments"] for _, d in rest] == ['"city": "Paris"', ', "days": 3', "}"]
    assert rest[0][0].endswith("Paris\n</parameter>")  # a value is sent once it is complete
    # Blank text before a call is never sent as content.
    assert stream_pieces(PARSER, "\n\n" + text, [1, 2, len(text) + 2])[0] == ""
