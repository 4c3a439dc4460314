"""Parameter values written as text, typed by the request's tool schema (qwen3_coder)."""

from __future__ import annotations

import pytest

from vllm_volta.entrypoints.openai.tool_arguments import convert_value, declared_types, parameter_schemas


@pytest.mark.parametrize("text,schema,want", [
    ("42", {"type": "integer"}, 42), ("-7", {"type": "int64"}, -7), ("4.5", {"type": "integer"}, "4.5"),
    ("1_000", {"type": "integer"}, "1_000"),  # Python's int() would take it; JSON has no such number
    ("3", {"type": "number"}, 3), ("2.50", {"type": "number"}, 2.5), ("1e3", {"type": "float"}, 1000.0),
    ("nan", {"type": "number"}, "nan"), ("inf", {"type": "number"}, "inf"),
    ("12 apples", {"type": "number"}, "12 apples"),
    ("True", {"type": "boolean"}, True), ("false", {"type": "boolean"}, False), ("yes", {"type": "boolean"}, "yes"),
    ('{"a": [1, null]}', {"type": "object"}, {"a": [1, None]}), ("{'a': True}", {"type": "object"}, {"a": True}),
    ("[1, 2]", {"type": "object"}, "[1, 2]"), ("[1, 2]", {"type": "array"}, [1, 2]),
    ("{1, 2}", {"type": "array"}, "{1, 2}"),
    ("{b'x': 1}", {"type": "object"}, "{b'x': 1}"),  # a literal JSON cannot hold stays text
    ("null", {"type": "string"}, None), ("NULL", {"type": "integer"}, None), ("None", {"type": "integer"}, "None"),
    ("007", {"type": "string"}, "007"), (" 42 ", {"type": "string"}, " 42 "), (" 42 ", {"type": "integer"}, 42),
    ("42", None, "42"), ("42", {}, "42"), ("42", {"description": "no type"}, "42"),
    ("42", {"type": ["integer", "null"]}, 42), ("x", {"type": ["integer", "string"]}, "x"),
    ("42", {"type": ["string", "integer"]}, "42"),  # the first declared type that fits
    ("42", {"anyOf": [{"type": "boolean"}, {"type": "integer"}]}, 42),
])
def test_convert_value(text, schema, want):
    got = convert_value(text, schema)
    assert got == want and type(got) is type(want)


def test_schema_lookup():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "g"}}]
    assert parameter_schemas(tools, "f") == {"a": {"type": "integer"}}
    assert parameter_schemas(tools, "g") == {} and parameter_schemas(tools, "h") is None
    assert parameter_schemas(None, "f") is None
    assert declared_types({"type": ["Integer", "null"], "oneOf": [{"type": "string"}]}) == ["integer", "null", "string"]
