"""What every tool-call parser shares: the ``ToolCall`` of a response, and the stream of formats
whose calls are read argument by argument (``qwen3_coder``, ``gemma4``).

Such a parser has ``scan(text, final) -> (content, calls)``: the content and the ``PartialCall``s
that are certain in ``text`` so far. With ``final=False`` a scan only reports what no later text
can change: the content grows, a call's name never changes once reported, its arguments only gain
whole key/value pairs, and it closes once. ``IncrementalToolCalls`` turns successive scans into
OpenAI stream deltas the way vLLM sends them: a call's first delta carries its index, id, type
and name (with the arguments known by then), later ones only argument text; the argument texts
of a call add up to the non-streamed call's ``arguments``.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=new_call_id)

    def to_dict(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class PartialCall:
    """A call as far as it is known: its name, the key/value pairs whose values are complete,
    and whether its argument object is closed."""

    name: str
    pairs: list[tuple[str, Any]] = field(default_factory=list)
    closed: bool = False

    def add(self, key: str, value: Any) -> None:
        # A repeated key keeps its first value: what was streamed cannot be taken back.
        if all(k != key for k, _ in self.pairs):
            self.pairs.append((key, value))

    def arguments(self) -> str:
        """The arguments' JSON text so far; closed, it equals json.dumps of the pairs' dict."""
        body = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                         for k, v in self.pairs)
        return "{" + body + ("}" if self.closed else "")

    def to_call(self) -> ToolCall:
        return ToolCall(self.name, self.arguments())


class ScanningParser:
    """A tool-call parser defined by ``scan`` (the content and calls certain in a text so far, all
    of it when ``final``): whole outputs (``extract``) and streams (``streamer``) read through it."""

    finish_reason = "tool_calls"

    def scan(self, text: str, final: bool) -> tuple[str, list[PartialCall]]:
        raise NotImplementedError

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole output: the text itself when it holds no call."""
        content, calls = self.scan(text, True)
        if not calls:
            return text, []
        return (content if content.strip() else None), [c.to_call() for c in calls]

    def streamer(self) -> IncrementalToolCalls:
        return IncrementalToolCalls(self)


@dataclass
class ToolCallDelta:
    """One call's part of a stream chunk (``choices[].delta.tool_calls[]``)."""

    index: int
    arguments: str
    id: str | None = None  # set on a call's first delta, with its name
    name: str | None = None

    def to_dict(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class IncrementalToolCalls:
    """One choice's stream: ``feed(text so far, final)`` -> (new content, call deltas).

    Content that is only blanks is held until it is known not to precede calls (a response
    with calls has no blank content). ``num_calls`` is the number of closed calls: the index
    of the first call a next feed may extend, and the response's call count once final."""

    def __init__(self, parser: ScanningParser) -> None:
        self.parser = parser
        self._content_sent = 0
        self._args_sent: list[int] = []
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        content, calls = self.parser.scan(text, final)
        if not content.strip() and (calls or not final):
            content = ""
        new_content = content[self._content_sent:]
        self._content_sent = max(self._content_sent, len(content))
        deltas = []
        for index, call in enumerate(calls):
            arguments = call.arguments()
            if index == len(self._args_sent):
                deltas.append(ToolCallDelta(index, arguments, new_call_id(), call.name))
                self._args_sent.append(len(arguments))
            elif len(arguments) > self._args_sent[index]:
                deltas.append(ToolCallDelta(index, arguments[self._args_sent[index]:]))
                self._args_sent[index] = len(arguments)
        self.num_calls = sum(call.closed for call in calls)
        return new_content, deltas
