"""Typed arguments for formats that write every parameter value as text (``qwen3_coder``): the
request's tool schema says what JSON type each parameter is, as vLLM reads it.

- the text ``null`` (any case) is JSON null, whatever the declared type;
- ``integer`` (and int-like names: ``int32``, ``long``...): a whole number, else the text;
- ``number`` / ``float``: an int when written as one, else a finite float, else the text;
- ``boolean``: ``true`` / ``false`` in any case, else the text;
- ``object`` / ``array``: JSON (or a Python literal) of that kind, else the text;
- ``string``, an undeclared parameter or an unknown tool: the text.
A type list (``["integer", "null"]``) or ``anyOf`` / ``oneOf`` tries each declared type in order.
"""
from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

_INT = re.compile(r"[+-]?\d+")
_STRINGS = ("string", "str", "text", "varchar", "char", "enum")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parameter_schemas(tools: list[dict] | None, name: str) -> dict[str, dict] | None:
    """The ``properties`` of the tool called `name` (None when no such tool was sent)."""
    for tool in tools or []:
        function = tool.get("function") or {}
        if function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties")
            return properties if isinstance(properties, dict) else {}
    return None


def declared_types(schema: dict) -> list[str]:
    """The JSON types a parameter's schema allows, in the order it lists them."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            if isinstance(option, dict):
                kinds += declared_types(option)
    return [k.lower() for k in kinds if isinstance(k, str)]


def convert_value(text: str, schema: dict | None) -> Any:
    """The JSON value of a parameter written as `text`, by its schema (None: undeclared)."""
    if text.strip().lower() == "null":
        return None
    if not isinstance(schema, dict):
        return text
    for kind in declared_types(schema):
        if kind in _STRINGS:
            return text
        ok, value = _as_type(text.strip(), kind)
        if ok:
            return value
    return text


def _as_type(text: str, kind: str) -> tuple[bool, Any]:
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        return (True, int(text)) if _INT.fullmatch(text) else (False, None)
    if kind.startswith(("num", "float", "double")):
        if _INT.fullmatch(text):
            return True, int(text)
        if _FLOAT.fullmatch(text) and math.isfinite(float(text)):
            return True, float(text)
        return False, None
    if kind in ("boolean", "bool", "binary"):
        lowered = text.lower()
        return (True, lowered == "true") if lowered in ("true", "false") else (False, None)
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        want = dict if kind == "object" or kind.startswith("dict") else list
        for load in (json.loads, ast.literal_eval):
            try:
                value = load(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, want):
                try:
                    json.dumps(value)  # a literal may hold what JSON cannot (sets, bytes)
                except (TypeError, ValueError):
                    return False, None
                return True, value
        return False, None
    return False, None
