"""The constraints xgrammar would not enforce are refused: checked against Python's re (the
regex semantics the client means) and against xgrammar itself (what it would accept)."""

from __future__ import annotations

import json
import re

import pytest

from vllm_volta.structured_output_checks import check_regex_anchors, check_schema_enforceable

xgr = pytest.importorskip("xgrammar")


def _xgrammar_accepts(compiled, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.fixture(scope="module")
def compiler():
    vocab = [chr(i) for i in range(32, 127)] + ["</s>"]
    return xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1]))


@pytest.mark.parametrize("pattern,text", [("a^b", "ab"), ("a$b", "ab"), ("(^a)b", "ab"),
                                          ("x|^y", "y")])
def test_inner_anchors_are_refused(pattern, text):
    with pytest.raises(ValueError, match="anchor"):
        check_regex_anchors(pattern)


@pytest.mark.parametrize("pattern,text", [("^ab$", "ab"), ("[^a]b", "cb"), ("a\\^b", "a^b"),
                                          ("[a^]+", "a^"), ("a\\$", "a$"), ("ab$", "ab")])
def test_edge_anchors_classes_and_escapes_pass(compiler, pattern, text):
    check_regex_anchors(pattern)
    # What xgrammar accepts for them is what Python's re matches.
    assert re.fullmatch(pattern, text)
    assert _xgrammar_accepts(compiler.compile_regex(pattern), text)


# (schema, a JSON text that breaks it, which xgrammar's grammar would still accept)
UNENFORCED = [({"not": {"type": "integer"}}, "1"),
              ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
              ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
              ({"allOf": [{"type": "integer", "minimum": 3}, {"maximum": 2}]}, "1"),
              ({"type": "object", "properties": {"a": {"type": "integer"}},
                "dependentRequired": {"a": ["b"]}}, '{"a": 1}')]


@pytest.mark.parametrize("schema,breaking", UNENFORCED)
def test_unenforced_keywords_are_refused(compiler, schema, breaking):
    jsonschema = pytest.importorskip("jsonschema")
    # The reason to refuse: the grammar lets through a text the schema forbids.
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(breaking))
    assert _xgrammar_accepts(compiler.compile_json_schema(json.dumps(schema),
                                                          any_whitespace=False), breaking)
    with pytest.raises(ValueError, match="not supported"):
        check_schema_enforceable(schema)
    nested = {"type": "object", "properties": {"x": {"type": "array", "items": schema}}}
    with pytest.raises(ValueError, match="#/properties/x/items"):
        check_schema_enforceable(nested)


def test_enforced_schemas_pass():
    check_schema_enforceable({"type": "object", "properties": {
        "not": {"type": "string"}, "if": {"type": "integer"}},  # property names, not keywords
        "required": ["not"], "additionalProperties": False})
    check_schema_enforceable({"anyOf": [{"type": "integer"}, {"type": "null"}],
                              "$defs": {"x": {"enum": [1, 2]}}})
    deep: dict = {"type": "integer"}
    for _ in range(5000):  # iterative: no recursion limit
        deep = {"type": "array", "items": deep}
    check_schema_enforceable(deep)
