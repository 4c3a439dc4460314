"""Constraints xgrammar would compile but not enforce, refused before a request runs.

xgrammar reads regex anchors as no-ops (``a^b`` compiles to ``ab``, which ``a^b`` never
matches) and skips some JSON-schema keywords (``not``, ``if``/``then``/``else``,
``uniqueItems``, ``contains``, ``dependentRequired``, ``dependentSchemas``, and all but one
branch of ``allOf``): output constrained by them could break the constraint the client sent.
Such constraints are a ValueError naming the part that cannot be honoured.
"""

from __future__ import annotations

from typing import Any

# Keywords whose violations xgrammar's JSON-schema grammar still accepts.
UNENFORCED_KEYWORDS = ("not", "if", "then", "else", "uniqueItems", "contains", "minContains",
                       "maxContains", "dependentRequired", "dependentSchemas", "dependencies")
# Keywords holding one subschema, a list of them, or a name -> subschema map.
_ONE = ("items", "additionalItems", "additionalProperties", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions")


def check_regex_anchors(pattern: str) -> None:
    """ValueError unless ``^`` only opens and ``$`` only closes the pattern (outside
    character classes and escapes); elsewhere xgrammar would ignore them."""
    in_class = False
    i, last = 0, len(pattern) - 1
    while i <= last:
        ch = pattern[i]
        if ch == "\\":
            i += 2  # an escaped character is a literal
            continue
        if in_class:
            in_class = ch != "]" or pattern[i - 1] == "["  # "[]...]": ] first is a literal
        elif ch == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "^":  # negation, not an anchor
                i += 1
        elif ch == "^" and i != 0:
            raise ValueError(f"structured_outputs: regex anchor '^' at position {i} is only "
                             "supported at the start of the pattern")
        elif ch == "$" and i != last:
            raise ValueError(f"structured_outputs: regex anchor '$' at position {i} is only "
                             "supported at the end of the pattern")
        i += 1


def check_schema_enforceable(schema: Any) -> None:
    """ValueError naming the first keyword of ``schema`` (a JSON schema) that the grammar
    would not enforce, with its path in the schema."""
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:  # iterative: a deep schema cannot overflow the interpreter's stack
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        for keyword in UNENFORCED_KEYWORDS:
            if keyword in node:
                raise ValueError(f"structured_outputs: JSON schema keyword {keyword!r} at "
                                 f"{path} is not supported (output could not be held to it)")
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            raise ValueError(f"structured_outputs: JSON schema 'allOf' with more than one "
                             f"schema at {path} is not supported; merge them into one")
        for key in _ONE:
            sub = node.get(key)
            if isinstance(sub, list):
                stack.extend((s, f"{path}/{key}/{i}") for i, s in enumerate(sub))
            elif isinstance(sub, dict):
                stack.append((sub, f"{path}/{key}"))
        for key in _LIST:
            if isinstance(node.get(key), list):
                stack.extend((s, f"{path}/{key}/{i}") for i, s in enumerate(node[key]))
        for key in _MAP:
            if isinstance(node.get(key), dict):
                stack.extend((s, f"{path}/{key}/{name}") for name, s in node[key].items())
