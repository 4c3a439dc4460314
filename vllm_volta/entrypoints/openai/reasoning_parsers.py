"""Reasoning in generated text (vLLM's ``--reasoning-parser``): the part of a chat output between
``<think>`` and ``</think>`` goes to the message's ``reasoning_content``, the rest to ``content``.

- ``qwen3``: reasoning only when the output starts with ``<think>`` (Qwen3 writes no block with
  thinking switched off); up to ``</think>``, or to the end when the block is not closed.
- ``deepseek_r1``: the output is reasoning up to ``</think>`` (a leading ``<think>`` is dropped;
  the R1 and thinking-only templates open the block in the prompt); without the closing tag, all
  of it.
"""
from __future__ import annotations

from vllm_volta.entrypoints.openai.tool_parsers import partial_suffix

START, END = "<think>", "</think>"


class Qwen3ReasoningParser:
    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of an output (None for an empty part)."""
        if not text.startswith(START):
            return None, text or None
        return _split_at_end(text[len(START):])


class DeepSeekR1ReasoningParser:
    def split(self, text: str) -> tuple[str | None, str | None]:
        return _split_at_end(text[len(START):] if text.startswith(START) else text)


def _split_at_end(text: str) -> tuple[str | None, str | None]:
    reasoning, closed, content = text.partition(END)
    return reasoning or None, (content or None) if closed else None


class ReasoningStream:
    """One choice's stream: ``feed(text so far, final)`` -> (new reasoning, new content). The end
    of the text that may be the start of a tag is held back until it is certain."""

    def __init__(self, parser: Qwen3ReasoningParser | DeepSeekR1ReasoningParser) -> None:
        self.parser = parser
        self._sent = [0, 0]
        self.content = ""  # all content so far (what a tool-call parser reads)

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        if not final:
            text = text[:len(text) - max(partial_suffix(text, START), partial_suffix(text, END))]
        parts = [p or "" for p in self.parser.split(text)]
        deltas = [p[sent:] for p, sent in zip(parts, self._sent)]
        self._sent = [len(p) for p in parts]
        self.content = parts[1]
        return deltas[0], deltas[1]


ReasoningParser = Qwen3ReasoningParser | DeepSeekR1ReasoningParser
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {"deepseek_r1": DeepSeekR1ReasoningParser,
                                                       "qwen3": Qwen3ReasoningParser}
