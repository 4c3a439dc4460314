"""Reasoning in generated text (vLLM's ``--reasoning-parser``): the model's thinking goes to the
message's ``reasoning_content``, the rest to ``content``.

- ``qwen3``: Qwen3, Qwen3.5, Qwen3-Next: a ``<think>...</think>`` block. Qwen3 opens it in its
  output (and writes none with thinking switched off); Qwen3.5's template opens it in the prompt
  when thinking is on, so the output is reasoning up to ``</think>`` with no opening tag. Both
  shapes are read: an output that starts with ``<think>`` is reasoning up to ``</think>`` (to the
  end when the block is not closed); one that holds ``</think>`` with no ``<think>`` before it is
  reasoning up to there; anything else is content. When the prompt is known (``for_prompt``),
  whether it leaves a block open decides how the output starts, and streams need not wait.
- ``deepseek_r1``: the output is reasoning up to ``</think>`` (a leading ``<think>`` is dropped;
  the R1 and thinking-only templates open the block in the prompt); without the closing tag, all
  of it.
- ``gemma4``: Gemma 4 (Google's Gemma 4 prompt-formatting page; vLLM's ``gemma4`` reasoning
  parser): an output that starts with ``<|channel>`` (or whose prompt ends inside one, as a
  template's thought cue may) is reasoning up to ``<channel|>``, less the channel's ``thought\\n``
  label; a ``<|tool_call>`` also ends it (and stays in the content). A prompt that closes an empty
  channel (thinking off) leaves plain content. The markers are special tokens: requests keep
  special tokens in their text (``keeps_special_tokens``).

``split(text)`` reads a whole output; ``stream_split(text, final)`` the parts of a text so far
that no later text can change.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_volta.entrypoints.openai.tool_call_stream import partial_suffix

START, END = "<think>", "</think>"
PROMPT_TAIL_TOKENS = 8  # the end of a prompt decoded to see whether it opened a block


def _held(text: str, *tags: str) -> str:
    """`text` without an end that may be the start of one of `tags`."""
    return text[:len(text) - max(partial_suffix(text, tag) for tag in tags)]


def _split_at(text: str, end: str) -> tuple[str | None, str | None]:
    reasoning, closed, content = text.partition(end)
    return reasoning or None, (content or None) if closed else None


def _strings(parts: tuple[str | None, str | None]) -> tuple[str, str]:
    return parts[0] or "", parts[1] or ""


class Qwen3ReasoningParser:
    def __init__(self, opened: bool | None = None) -> None:
        self.opened = opened  # whether the prompt left a block open (None: unknown)

    def for_prompt(self, prompt: str) -> Qwen3ReasoningParser:
        """This parser for outputs of `prompt`: one that ends with <think> opened the block (Qwen3.5
        thinking), one that ends with </think> closed it (thinking off); else unknown."""
        tail = prompt.rstrip()
        return Qwen3ReasoningParser(True if tail.endswith(START) else False if tail.endswith(END) else None)

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of an output (None for an empty part)."""
        if text.startswith(START):
            return _split_at(text[len(START):], END)
        end = text.find(END)
        if self.opened or (self.opened is None and end >= 0 and START not in text[:end]):
            return _split_at(text, END)
        return None, text or None

    def stream_split(self, text: str, final: bool) -> tuple[str, str]:
        if final:
            return _strings(self.split(text))
        if START.startswith(text):  # nothing yet, or maybe the opening tag
            return "", ""
        if text.startswith(START) or self.opened:
            return _strings(self.split(_held(text, END)))
        if self.opened is False or START in text[:text.find(END) if END in text else len(text)]:
            return "", text  # no block
        if END in text:
            return _strings(self.split(text))
        return "", ""  # reasoning or content: known at </think> or at the end


class DeepSeekR1ReasoningParser:
    def split(self, text: str) -> tuple[str | None, str | None]:
        return _split_at(text[len(START):] if text.startswith(START) else text, END)

    def stream_split(self, text: str, final: bool) -> tuple[str, str]:
        return _strings(self.split(text if final else _held(text, START, END)))


class Gemma4ReasoningParser:
    start, end, tool_call, label = "<|channel>", "<channel|>", "<|tool_call>", "thought\n"
    keeps_special_tokens = True

    def __init__(self, opened: bool | None = None) -> None:
        self.opened = opened  # whether the prompt left a channel open (None: unknown)

    def for_prompt(self, prompt: str) -> Gemma4ReasoningParser:
        """This parser for outputs of `prompt`: one that ends inside a channel (a template's
        thought cue) opened it; otherwise the output opens its own."""
        tail = prompt.rstrip()
        return Gemma4ReasoningParser(tail.rfind(self.start) > tail.rfind(self.end)
                                     and tail.endswith((self.start, self.start + self.label.strip())))

    def _body(self, text: str) -> str | None:
        """The output after the channel's opening (None: it opens no channel)."""
        if text.startswith(self.start):
            return text[len(self.start):]
        return text if self.opened else None

    def split(self, text: str) -> tuple[str | None, str | None]:
        body = self._body(text)
        if body is None:
            return None, text or None
        ends = [(i, len(self.end)) for i in (body.find(self.end),) if i >= 0]
        ends += [(i, 0) for i in (body.find(self.tool_call),) if i >= 0]
        stop, skip = min(ends) if ends else (len(body), 0)
        reasoning = body[:stop]
        reasoning = reasoning[len(self.label):] if reasoning.startswith(self.label) else reasoning
        return reasoning or None, (body[stop + skip:] or None) if ends else None

    def stream_split(self, text: str, final: bool) -> tuple[str, str]:
        if final:
            return _strings(self.split(text))
        if self.start.startswith(text):
            return "", ""
        body = self._body(text)
        if body is None:
            return "", text
        if self.end not in body and self.tool_call not in body:
            body = _held(body, self.end, self.tool_call)
            if self.label.startswith(body):  # the label may still be arriving
                return "", ""
        return _strings(self.split(self.start + body))


def bind_prompt(parser: ReasoningParser, tokenizer: Any, prompt_ids: Sequence[int]) -> ReasoningParser:
    """`parser` for the outputs of one prompt (for parsers that read how the prompt ends)."""
    for_prompt = getattr(parser, "for_prompt", None)
    if for_prompt is None:
        return parser
    return for_prompt(tokenizer.decode(list(prompt_ids[-PROMPT_TAIL_TOKENS:])))


class ReasoningStream:
    """One choice's stream: ``feed(text so far, final)`` -> (new reasoning, new content)."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self._sent = [0, 0]
        self.content = ""  # all content so far (what a tool-call parser reads)

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        parts = self.parser.stream_split(text, final)
        deltas = [p[sent:] for p, sent in zip(parts, self._sent)]
        self._sent = [max(len(p), sent) for p, sent in zip(parts, self._sent)]
        self.content = parts[1]
        return deltas[0], deltas[1]


ReasoningParser = Qwen3ReasoningParser | DeepSeekR1ReasoningParser | Gemma4ReasoningParser
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {"deepseek_r1": DeepSeekR1ReasoningParser,
                                                       "gemma4": Gemma4ReasoningParser,
                                                       "qwen3": Qwen3ReasoningParser}
