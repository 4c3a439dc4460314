"""Tool calls in generated text (vLLM's ``--tool-call-parser``).

- ``hermes``: the format of Hermes, Qwen2.5 and Qwen3 chat templates: each call is a JSON object
  ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``; text before
  the first tag is the message content.
- ``llama3_json``: Llama 3.1 / 3.2 / 3.3 (JSON tool calling): the whole output is one or more
  ``{"name": ..., "parameters": {...}}`` objects separated by ``;``, after an optional
  ``<|python_tag|>``.
- ``pythonic``: Llama 3.2 / 4 pythonic templates: the whole output is a Python list of calls with
  literal keyword arguments, ``[get_weather(city="Paris"), now()]``.
- ``mistral``: Mistral's ``[TOOL_CALLS]`` special token, then a JSON list of
  ``{"name": ..., "arguments": {...}}`` (tokenizer v3: Mistral 7B v0.3, Nemo), or one or more
  ``[TOOL_CALLS]name[ARGS]{...}`` (tokenizer v11 and later: Mistral Small 3.2, Devstral).
- ``qwen3_coder``: Qwen3-Coder, Qwen3-Next, Qwen3.5: ``<tool_call><function=NAME>`` with one
  ``<parameter=KEY>`` tag per argument, typed by the request's tool schema
  (``tool_parsers_qwen3_coder``); its calls stream argument by argument.
- ``gemma4``: Gemma 4: ``<|tool_call>call:NAME{key:value,...}<tool_call|>`` in Gemma's own value
  notation (``tool_parsers_gemma4``); its calls stream argument by argument.

An output that does not hold well-formed calls is returned as plain content, as vLLM does. Each
parser has ``extract(text) -> (content, calls)`` and ``streamer()``, whose ``feed(text so far,
final)`` returns the content and the calls that are certain by then (whole calls, or for the two
argument-by-argument formats ``ToolCallDelta``s that carry their own index). ``NamedToolCall`` and
``RequiredToolCalls`` read outputs that structured outputs constrained (tool_choice naming a
function, or "required"); they need no server flag.
"""
from __future__ import annotations

import ast
import json
import re

from vllm_volta.entrypoints.openai.tool_call_stream import ToolCall, partial_suffix
from vllm_volta.entrypoints.openai.tool_parsers_gemma4 import Gemma4ToolParser
from vllm_volta.entrypoints.openai.tool_parsers_qwen3_coder import Qwen3CoderToolParser


class HermesToolParser:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks."""

    finish_reason = "tool_calls"  # of a response with calls

    start = "<tool_call>"
    end = "</tool_call>"
    _blocks = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole output; (text, []) when it holds no valid call."""
        if self.start not in text:
            return text, []
        try:
            calls = [self.parse_call(body) for body in self._blocks.findall(text)]
        except ValueError:
            return text, []
        content = text[:text.index(self.start)]
        return (content if content.strip() else None), calls

    @staticmethod
    def parse_call(body: str) -> ToolCall:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {body!r}") from exc
        return _tool_call(obj, "arguments")

    def streamer(self) -> StreamingToolCalls:
        return StreamingToolCalls(self)


def _tool_call(obj: object, arguments_key: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError(f"not a tool call: {obj!r}")
    arguments = obj.get(arguments_key, {})
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call {arguments_key} must be an object: {obj!r}")
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


class Llama3JsonToolParser:
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}`` (``; `` between calls)."""

    finish_reason = "tool_calls"

    python_tag = "<|python_tag|>"
    call_starts = ("{", python_tag)

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip()
        if body.startswith(self.python_tag):
            body = body[len(self.python_tag):].lstrip()
        if not body.startswith("{"):
            return text, []
        decoder, calls, pos = json.JSONDecoder(), [], 0
        try:
            while pos < len(body):
                obj, pos = decoder.raw_decode(body, pos)
                calls.append(_tool_call(obj, "parameters" if "parameters" in obj else "arguments"))
                while pos < len(body) and body[pos] in " \t\n;":
                    pos += 1
        except (ValueError, TypeError):
            return text, []
        return None, calls

    def streamer(self) -> BufferedToolCalls:
        return BufferedToolCalls(self)


class PythonicToolParser:
    """``[f(a=1, b="x"), g()]``: a list of calls with literal keyword arguments."""

    finish_reason = "tool_calls"
    call_starts = ("[",)  # how an output of calls begins (BufferedToolCalls holds it)

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip()
        if not body.startswith("["):
            return text, []
        try:
            tree = ast.parse(body, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                raise ValueError(body)
            calls = []
            for call in tree.elts:
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args):
                    raise ValueError(body)
                arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
                if None in arguments:  # **kwargs
                    raise ValueError(body)
                calls.append(ToolCall(call.func.id, json.dumps(arguments, ensure_ascii=False)))
        except (SyntaxError, ValueError, TypeError):
            return text, []
        return None, calls

    def streamer(self) -> BufferedToolCalls:
        return BufferedToolCalls(self)


class MistralToolParser:
    """``[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}``
    (repeated). The marker is a special token: requests parsed with this parser keep special
    tokens in their text (``keeps_special_tokens``)."""

    finish_reason = "tool_calls"
    marker = "[TOOL_CALLS]"
    call_starts = (marker,)
    keeps_special_tokens = True

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if self.marker not in text:
            return text, []
        start = text.index(self.marker)
        calls: list[ToolCall] = []
        try:
            for part in text[start:].split(self.marker)[1:]:
                name, sep, args = part.partition("[ARGS]")
                if sep:  # v11: name[ARGS]{...}
                    arguments = json.loads(args)
                    if not isinstance(arguments, dict) or not name.strip():
                        raise ValueError(part)
                    calls.append(ToolCall(name.strip(), json.dumps(arguments, ensure_ascii=False)))
                    continue
                items = json.loads(part)  # v3: a JSON list of calls (or one call)
                calls += [_tool_call(obj, "arguments") for obj in (items if isinstance(items, list) else [items])]
        except (ValueError, TypeError):
            return text, []
        if not calls:
            return text, []
        content = text[:start]
        return (content if content.strip() else None), calls

    def streamer(self) -> BufferedToolCalls:
        return BufferedToolCalls(self)


class BufferedToolCalls:
    """A stream for formats whose calls are the whole output: content streams as it comes
    unless the output starts like calls (the parser's ``call_starts``), which is held to the
    end and parsed whole."""

    def __init__(self, parser: Llama3JsonToolParser | PythonicToolParser | MistralToolParser) -> None:
        self.parser = parser
        self._held: bool | None = None  # None: undecided (only blanks or a tag prefix so far)
        self._sent = 0
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        if self._held is None:
            head, starts = text.lstrip(), self.parser.call_starts
            if head.startswith(starts):
                self._held = True
            elif head and not any(start.startswith(head) for start in starts):
                self._held = False
            elif not final:
                return "", []
        if self._held and final:
            content, calls = self.parser.extract(text)
            self.num_calls += len(calls)
            return content or "", calls
        if self._held:
            return "", []
        content, self._sent = text[self._sent:], len(text)
        return content, []


class StreamingToolCalls:
    """One choice's stream: ``feed(text so far)`` returns the content and the calls that are
    now certain. Content is held back while it may be the start of a tag; a call is sent once
    its closing tag arrived (an unclosed last one at ``feed(..., final=True)``), with all its
    arguments at once. A tagged block that is no tool call is sent as content; text between
    and after blocks is dropped, as ``extract`` drops it."""

    def __init__(self, parser: HermesToolParser) -> None:
        self.parser = parser
        self._content_sent = 0  # characters of content sent
        self._pos: int | None = None  # where parsing resumes once the first tag was seen
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        start, end = self.parser.start, self.parser.end
        if self._pos is None:
            first = text.find(start)
            if first < 0:
                safe = len(text) if final else len(text) - partial_suffix(text, start)
                content = text[self._content_sent:safe]
                self._content_sent = max(self._content_sent, safe)
                return content, []
            content, self._pos = text[self._content_sent:first], first
        else:
            content = ""
        calls = []
        while (tag := text.find(start, self._pos)) >= 0:
            close = text.find(end, tag)
            if close < 0 and not final:
                break
            body_end = len(text) if close < 0 else close
            block_end = len(text) if close < 0 else close + len(end)
            try:
                calls.append(self.parser.parse_call(text[tag + len(start):body_end]))
            except ValueError:
                content += text[tag:block_end]
            self._pos = block_end
        self.num_calls += len(calls)
        return content, calls


class NamedToolCall:
    """tool_choice naming a function: the output, constrained to the function's parameters
    schema, is the call's arguments. As OpenAI, such a response keeps finish_reason "stop"."""

    finish_reason = None

    def __init__(self, name: str) -> None:
        self.name = name

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            return None, [_tool_call({"name": self.name, "arguments": json.loads(text)}, "arguments")]
        except ValueError:  # cut short (max_tokens): not a whole JSON object
            return text, []

    def streamer(self) -> WholeOutputToolCalls:
        return WholeOutputToolCalls(self)


class RequiredToolCalls:
    """tool_choice "required": the output, constrained to a JSON array of
    ``{"name": <a tool>, "parameters": {...}}`` objects (``schema``), is the calls."""

    finish_reason = "tool_calls"

    @staticmethod
    def schema(tools: list[dict]) -> dict:
        return {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "required": ["name", "parameters"], "additionalProperties": False,
             "properties": {"name": {"enum": [t["function"]["name"]]},
                            "parameters": t["function"].get("parameters") or {"type": "object"}}}
            for t in tools]}}

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            calls = json.loads(text)
            if not isinstance(calls, list):
                raise ValueError(text)
            return None, [_tool_call(c, "parameters") for c in calls]
        except ValueError:
            return text, []

    def streamer(self) -> WholeOutputToolCalls:
        return WholeOutputToolCalls(self)


class WholeOutputToolCalls:
    """A stream whose output is all calls: held to the end, then parsed whole."""

    def __init__(self, parser: NamedToolCall | RequiredToolCalls) -> None:
        self.parser = parser
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        if not final:
            return "", []
        content, calls = self.parser.extract(text)
        self.num_calls += len(calls)
        return content or "", calls


def bind_tools(parser: ToolParser, tools: list[dict] | None) -> ToolParser:
    """`parser` for one request: formats that write values as text read their types from the
    request's tools (``for_request``); the others are shared as they are."""
    for_request = getattr(parser, "for_request", None)
    return for_request(tools) if for_request is not None else parser


ToolParser = (HermesToolParser | Llama3JsonToolParser | PythonicToolParser | MistralToolParser | Qwen3CoderToolParser
              | Gemma4ToolParser | NamedToolCall | RequiredToolCalls)
TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser,
                                             "llama3_json": Llama3JsonToolParser,
                                             "pythonic": PythonicToolParser,
                                             "mistral": MistralToolParser,
                                             "qwen3_coder": Qwen3CoderToolParser,
                                             "gemma4": Gemma4ToolParser}
