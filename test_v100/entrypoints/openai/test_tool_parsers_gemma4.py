"""The gemma4 tool-call parser: Gemma's value notation read into the JSON values it stands for,
malformed and cut-short calls, and streams cut anywhere that add up to the whole output's result."""

from __future__ import annotations

import json

import pytest

from test_v100.entrypoints.openai.tool_stream_checks import check_stream_matches_whole
from vllm_volta.entrypoints.openai.tool_parsers import TOOL_PARSERS, bind_tools

PARSER = bind_tools(TOOL_PARSERS["gemma4"](), None)
Q = '<|"|>'


def _gemma(value) -> str:
    """A value in Gemma 4's notation (as its chat template writes arguments): an independent
    writer the parser is checked against."""
    if isinstance(value, str):
        return Q + value + Q
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_gemma(v) for v in value) + "]"
    return "{" + ",".join(f"{k}:{_gemma(v)}" for k, v in value.items()) + "}"


def _call(name: str, arguments: dict) -> str:
    return f"<|tool_call>call:{name}{_gemma(arguments)}<tool_call|>"


WEATHER = {"city": 'Paris, "FR" {x}: [y]', "days": 3, "temp": -2.5, "big": 1e21, "metric": True,
           "note": None, "hours": [9, 12.5, False, "noon"], "where": {"lat": 48.85, "tags": {"a": []}},
           "empty": ""}
TWO_CALLS = "Checking.\n" + _call("get_weather", WEATHER) + _call("now", {})


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_whole_output():
    content, calls = PARSER.extract(TWO_CALLS)
    assert content == "Checking.\n"
    assert _calls(calls) == [("get_weather", WEATHER), ("now", {})]
    assert calls[0].arguments == json.dumps(WEATHER, ensure_ascii=False)
    assert PARSER.keeps_special_tokens  # the markers are special tokens
    # Blanks around the notation's parts, and a missing closing marker at the end, are read.
    content, calls = PARSER.extract('<|tool_call>call:f{ a : 1 , b : <|"|>x<|"|> , c:[ 1 , 2 ] }')
    assert content is None and _calls(calls) == [("f", {"a": 1, "b": "x", "c": [1, 2]})]
    # JSON's quoted strings (escapes and all) are read as strings too.
    assert _calls(PARSER.extract('<|tool_call>call:f{a: "x, \\"y\\" }", "b":[ "\\u00e9" ]}<tool_call|>')[1]) \
        == [("f", {"a": 'x, "y" }', "b": ["é"]})]
    # Jinja writes a null as None (the template renders earlier calls so).
    assert _calls(PARSER.extract("<|tool_call>call:f{a:None,b:[None]}<tool_call|>")[1]) == [("f", {"a": None, "b": [None]})]
    # An unquoted word is kept as text; a quoted key is read like a bare one.
    assert _calls(PARSER.extract('<|tool_call>call:f{mode:fast,<|"|>k<|"|>:2}<tool_call|>')[1]) \
        == [("f", {"mode": "fast", "k": 2})]


@pytest.mark.parametrize("text", [
    "Plain answer.",
    "<|tool_call>not a call<tool_call|>",
    "<|tool_call>call:bad name{a:1}<tool_call|>",
    "Sure <|tool_call>call:get_wea",  # cut before the name is complete
    "<|tool_call>",
])
def test_no_call_is_content(text):
    assert PARSER.extract(text) == (text, [])


@pytest.mark.parametrize("text,arguments", [
    ('<|tool_call>call:f{a:1,b:<|"|>cut sho', {"a": 1}),                # cut inside a string
    ('<|tool_call>call:f{a:<|"|>x<|"|>,b:12', {"a": "x"}),             # a number may have grown
    ('<|tool_call>call:f{a:[1,{b:2', {}),                                # cut inside a list
    ('<|tool_call>call:f{a:<|"|>x<|"|> b:1}<tool_call|>', {"a": "x"}),  # no comma: stops there
    ('<|tool_call>call:f{a:,b:1}<tool_call|>', {}),                      # no value
    ('<|tool_call>call:f{a:[1]]}<tool_call|>', {"a": [1]}),             # a stray bracket
])
def test_cut_short_or_malformed_arguments_keep_the_complete_pairs(text, arguments):
    content, calls = PARSER.extract(text)
    assert content is None and _calls(calls) == [("f", arguments)]


@pytest.mark.parametrize("text", [
    TWO_CALLS, "Plain <|tool_ answer", _call("now", {}) + "\n<|tool_response>",
    "  " + _call("f", {"s": "<|tool_call> inside a string"}),
    "Hi <|tool_call>oops<tool_call|> then " + _call("f", {"x": [1, {"y": None}]}) + " after",
    '<|tool_call>call:f{a:1,b:<|"|>cut sho', '<|tool_call>call:f{a:<|"|>x<|"|> b:1}<tool_call|>' + _call("g", {}),
    '<|tool_call>call:f{a: "x, \\"y\\" }", "b":[ "\\u00e9" ],c:"bad \\q"}<tool_call|>',
])
@pytest.mark.parametrize("seed", range(12))
def test_any_stream_split_gives_the_whole_outputs_result(text, seed):
    check_stream_matches_whole(PARSER, text, seed)
