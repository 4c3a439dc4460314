"""``gemma4``: the tool calls of Gemma 4 chat templates.

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

Sources: Google's "Gemma 4 prompt formatting" page (ai.google.dev/gemma/docs/core/
prompt-formatting-gemma4: the ``<|tool_call>`` / ``<tool_call|>`` pair, ``<|"|>`` around every
string value) and the documentation of vLLM's ``gemma4`` tool parser (``call:NAME{...}``, bare
keys, calls concatenated without a separator). The arguments are Gemma's own notation, not JSON:
keys are bare words, strings sit between ``<|"|>`` marks (no escapes inside), numbers,
``true`` / ``false`` / ``null`` are bare, objects are ``{key:value,...}``, arrays
``[value,...]`` (JSON's ``"..."`` strings, which some templates write, are read too). The
markers are special tokens, so requests parsed with this parser keep special
tokens in their text (``keeps_special_tokens``).

Text before the first call is content, text between and after calls is dropped; a block that is
not ``call:NAME{`` is content. Once its name is known a block is a call; arguments that stop
parsing (cut by max_tokens, or malformed) end the call with the pairs that were complete.
"""
from __future__ import annotations

import json
import re
from typing import Any

from vllm_volta.entrypoints.openai.tool_call_stream import PartialCall, ScanningParser, partial_suffix

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CALL = "call:"
_UNDECIDED = object()
_INCOMPLETE = object()  # the text ends before the value does
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_BARE_END = ",}]<"
# Bare words with a JSON meaning; None is how the template's Jinja writes a null argument.
_WORDS = {"true": True, "false": False, "null": None, "None": None}


class _Malformed(Exception):
    """The arguments cannot be read past this point, whatever text follows."""


class Gemma4ToolParser(ScanningParser):
    keeps_special_tokens = True

    def scan(self, text: str, final: bool) -> tuple[str, list[PartialCall]]:
        """(content, calls) certain in `text` so far (all of it when `final`)."""
        content, calls, pos = [], [], 0
        while True:
            tag = text.find(START, pos)
            if tag < 0:
                if not calls:
                    content.append(text[pos:len(text) if final else len(text) - partial_suffix(text, START)])
                return "".join(content), calls
            if not calls:
                content.append(text[pos:tag])
            block = self._block(text, tag + len(START), final)
            if block is _UNDECIDED:
                return "".join(content), calls
            if isinstance(block, int):
                content.append(text[tag:block])
                pos = block
                continue
            call, pos = block
            calls.append(call)
            if not call.closed:
                return "".join(content), calls

    @staticmethod
    def _block(text: str, pos: int, final: bool) -> object:
        """(call, end) of the block whose body starts at `pos`, the end of a block that is no
        call, or _UNDECIDED."""
        close = text.find(END, pos)
        brace = text.find("{", pos)
        name = text[pos + len(CALL):brace].strip() if brace >= 0 else ""
        if (text.startswith(CALL, pos) and brace >= 0 and (close < 0 or brace < close) and name
                and not any(c.isspace() or c in "<>{}[]:," for c in name)):
            return _arguments(text, PartialCall(name), brace + 1, final)
        if close >= 0:
            return close + len(END)
        return len(text) if final else _UNDECIDED


def _arguments(text: str, call: PartialCall, pos: int, final: bool) -> tuple[PartialCall, int]:
    """Reads the top-level pairs of `call` from `pos` (just after its ``{``); (call, where the
    text after it starts). A pair is added once its value is complete."""
    try:
        while True:
            pos = _skip_blank(text, pos)
            if text.startswith("}", pos):
                call.closed = True
                pos = _skip_blank(text, pos + 1)
                return call, pos + len(END) if text.startswith(END, pos) else pos
            if call.pairs:
                if pos >= len(text):
                    break
                if text[pos] != ",":
                    raise _Malformed
                pos += 1
            parsed = _pair(text, pos)
            if parsed is _INCOMPLETE:
                break
            key, value, pos = parsed
            call.add(key, value)
    except _Malformed:
        call.closed = True
        close = text.find(END, pos)
        return call, close + len(END) if close >= 0 else len(text)
    call.closed = final  # the output ended inside the call: the complete pairs stay
    return call, len(text)


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _pair(text: str, pos: int) -> object:
    """(key, value, end) of the ``key:value`` at `pos`, or _INCOMPLETE."""
    pos = _skip_blank(text, pos)
    if text.startswith((QUOTE, '"'), pos):
        key = _string(text, pos)
        if key is _INCOMPLETE:
            return _INCOMPLETE
        key, pos = key
    else:
        colon = text.find(":", pos)
        key = text[pos:colon if colon >= 0 else len(text)]
        if any(c in _BARE_END + "{[" for c in key) or (colon >= 0 and not key.strip()):
            raise _Malformed
        if colon < 0:
            return _INCOMPLETE
        key, pos = key.strip(), colon
    pos = _skip_blank(text, pos)
    if pos >= len(text):
        return _INCOMPLETE
    if text[pos] != ":":
        raise _Malformed
    value = _value(text, pos + 1)
    return _INCOMPLETE if value is _INCOMPLETE else (key, *value)


def _string(text: str, pos: int) -> object:
    """(string, end) of the ``<|"|>...<|"|>`` (or JSON ``"..."``) at `pos`, or _INCOMPLETE."""
    if text.startswith(QUOTE, pos):
        close = text.find(QUOTE, pos + len(QUOTE))
        return _INCOMPLETE if close < 0 else (text[pos + len(QUOTE):close], close + len(QUOTE))
    end = pos + 1
    while end < len(text) and text[end] != '"':
        end += 2 if text[end] == "\\" else 1
    if end >= len(text):
        return _INCOMPLETE
    try:
        return json.loads(text[pos:end + 1]), end + 1
    except ValueError:
        raise _Malformed from None


def _value(text: str, pos: int) -> object:
    """(value, end) of the value at `pos`, or _INCOMPLETE."""
    pos = _skip_blank(text, pos)
    if pos >= len(text) or QUOTE.startswith(text[pos:]):
        return _INCOMPLETE
    if text.startswith((QUOTE, '"'), pos):
        return _string(text, pos)
    if text[pos] in "{[":
        return _container(text, pos)
    end = pos
    while end < len(text) and text[end] not in _BARE_END:
        end += 1
    if end == len(text):
        return _INCOMPLETE  # a number may still be growing
    word = text[pos:end].strip()
    if not word:
        raise _Malformed
    if word in _WORDS:
        return _WORDS[word], end
    if _NUMBER.fullmatch(word):
        return (float(word) if any(c in word for c in ".eE") else int(word)), end
    return word, end  # an unquoted word: kept as text


def _container(text: str, pos: int) -> object:
    """(dict or list, end) of the ``{...}`` / ``[...]`` at `pos`, or _INCOMPLETE."""
    is_object, close = text[pos] == "{", "}" if text[pos] == "{" else "]"
    items: Any = {} if is_object else []
    pos += 1
    while True:
        pos = _skip_blank(text, pos)
        if pos >= len(text):
            return _INCOMPLETE
        if text[pos] == close:
            return items, pos + 1
        if items:
            if text[pos] != ",":
                raise _Malformed
            pos += 1
        if is_object:
            parsed = _pair(text, pos)
            if parsed is _INCOMPLETE:
                return _INCOMPLETE
            key, value, pos = parsed
            items.setdefault(key, value)
        else:
            parsed = _value(text, pos)
            if parsed is _INCOMPLETE:
                return _INCOMPLETE
            value, pos = parsed
            items.append(value)
