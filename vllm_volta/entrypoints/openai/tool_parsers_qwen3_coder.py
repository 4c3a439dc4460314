"""``qwen3_coder``: the XML tool calls of Qwen3-Coder, Qwen3-Next and Qwen3.5 chat templates.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Several blocks may follow each other; text before the first is the message content, text between
and after them is dropped. Values are text: one newline after ``<parameter=NAME>`` and one before
``</parameter>`` belong to the layout, and the value becomes the JSON type the request's tool
schema declares (``tool_arguments``). As in vLLM, a value also ends where the next
``<parameter=`` or ``</function>`` starts when its closing tag is missing.

As in vLLM, a ``<function=NAME>`` without the ``<tool_call>`` before it is a call too (Qwen3-Coder
sometimes leaves it out). A block that does not start with ``<function=NAME>`` is content (for a
bare tag with a malformed name, the tag itself, dropped after calls). Once its name is known a
block is a call (its name is streamed then); if the output ends inside it (max_tokens), the call
keeps the parameters whose values were complete and a value cut short is dropped.
"""
from __future__ import annotations

from vllm_volta.entrypoints.openai.tool_arguments import convert_value, parameter_schemas
from vllm_volta.entrypoints.openai.tool_call_stream import PartialCall, ScanningParser, partial_suffix

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_UNDECIDED = object()  # a block whose first tag is not complete yet


class Qwen3CoderToolParser(ScanningParser):

    def __init__(self, tools: list[dict] | None = None) -> None:
        self.tools = tools

    def for_request(self, tools: list[dict] | None) -> Qwen3CoderToolParser:
        """This parser reading one request's outputs (its tools type the values)."""
        return Qwen3CoderToolParser(tools)

    def scan(self, text: str, final: bool) -> tuple[str, list[PartialCall]]:
        """(content, calls) certain in `text` so far (all of it when `final`)."""
        content, calls, pos = [], [], 0
        while True:
            tag, body = _next_block(text, pos)
            if tag < 0:
                if not calls:  # a tag may still be starting at the end
                    held = 0 if final else max(partial_suffix(text, START), partial_suffix(text, FUNCTION))
                    content.append(text[pos:len(text) - held])
                return "".join(content), calls
            if not calls:
                content.append(text[pos:tag])
            block = self._block(text, body, final) if body > tag else self._bare(text, tag, final)
            if block is _UNDECIDED:
                return "".join(content), calls
            if isinstance(block, int):  # not a call: content, up to its closing tag
                if body > tag or not calls:  # (a stray bare tag after calls is dropped)
                    content.append(text[tag:block])
                pos = block
                continue
            call, pos = block
            calls.append(call)
            if not call.closed:
                return "".join(content), calls

    def _block(self, text: str, pos: int, final: bool) -> object:
        """The block whose body starts at `pos`: (call, end), the end of a block that is no
        call, or _UNDECIDED."""
        close = text.find(END, pos)
        head = text[pos:].lstrip()
        name_start = len(text) - len(head) + len(FUNCTION)
        name_end = text.find(">", name_start)
        if head.startswith(FUNCTION) and name_end >= 0 and (close < 0 or name_end < close):
            name = text[name_start:name_end].strip()
            if name and not any(_bad_name_char(c) for c in name):
                return self._arguments(text, PartialCall(name), name_end + 1, final)
        elif not final and close < 0 and (FUNCTION.startswith(head) or head.startswith(FUNCTION)):
            return _UNDECIDED
        if close >= 0:
            return close + len(END)
        return len(text) if final else _UNDECIDED

    def _bare(self, text: str, pos: int, final: bool) -> object:
        """A ``<function=NAME>`` at `pos` without <tool_call> (as vLLM, a call); when its name is
        or will be invalid, the tag alone is content."""
        name_start = pos + len(FUNCTION)
        name_end = text.find(">", name_start)
        name = text[name_start:name_end if name_end >= 0 else len(text)].strip()
        if any(_bad_name_char(c) for c in name) or (name_end >= 0 and not name) or (final and name_end < 0):
            return name_start
        if name_end < 0:
            return _UNDECIDED
        return self._arguments(text, PartialCall(name), name_end + 1, final)

    def _arguments(self, text: str, call: PartialCall, pos: int, final: bool) -> tuple[PartialCall, int]:
        """Reads `call`'s parameters from `pos`; (call, where the text after it starts)."""
        schemas = parameter_schemas(self.tools, call.name)
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if text.startswith(END, pos):  # </function> left out
                call.closed = True
                return call, pos + len(END)
            if text.startswith(FUNCTION_END, pos):
                call.closed = True
                pos += len(FUNCTION_END)
                after = text[pos:].lstrip()
                return call, (len(text) - len(after) + len(END) if after.startswith(END) else pos)
            if text.startswith(PARAMETER, pos):
                key_end = text.find(">", pos + len(PARAMETER))
                value_end, next_pos = _value_end(text, key_end + 1) if key_end >= 0 else (-1, -1)
                if value_end < 0:  # the key or the value is not complete
                    break
                key = text[pos + len(PARAMETER):key_end].strip()
                value = text[key_end + 1:value_end]
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
                if key:
                    call.add(key, convert_value(value, schemas.get(key) if schemas else None))
                pos = next_pos
                continue
            # Anything else between parameters is skipped up to the next tag.
            skip = [i for tag in (PARAMETER, FUNCTION_END, END) if (i := text.find(tag, pos)) >= 0]
            if not skip:
                break
            pos = min(skip)
        call.closed = final  # the output ended inside the call: what was complete stays
        return call, len(text)


def _next_block(text: str, pos: int) -> tuple[int, int]:
    """(where the next block starts, where its body starts) from `pos`: a <tool_call> block, or a
    bare <function= tag (body at the tag); (-1, -1) when there is none."""
    tagged, bare = text.find(START, pos), text.find(FUNCTION, pos)
    if tagged >= 0 and (bare < 0 or tagged < bare):
        return tagged, tagged + len(START)
    return bare, bare


def _bad_name_char(c: str) -> bool:
    return c.isspace() or c in "<>="


def _value_end(text: str, start: int) -> tuple[int, int]:
    """(end of the value that starts at `start`, where reading resumes), or (-1, -1) while the
    value may still grow."""
    ends = [(i, i + len(PARAMETER_END)) for i in (text.find(PARAMETER_END, start),) if i >= 0]
    ends += [(i, i) for tag in (PARAMETER, FUNCTION_END, END) if (i := text.find(tag, start)) >= 0]
    return min(ends) if ends else (-1, -1)
