"""Tokenizer loading (HF folder, hub name or GGUF file) and chat-template rendering."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("vllm_volta.tokenizer")

# Files whose presence means a folder carries its own HF tokenizer.
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _gguf_file_for(path: Path) -> Path | None:
    """The GGUF file to read the tokenizer from: the path itself, or the single .gguf of a
    folder that has no HF tokenizer files."""
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not any((path / f).exists() for f in _HF_TOKENIZER_FILES):
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return None


def get_tokenizer(source: str | os.PathLike, tokenizer: str | os.PathLike | None = None, *,
                  trust_remote_code: bool = False, revision: str | None = None,
                  **kwargs: Any):
    """Load the tokenizer of `source` (or of `tokenizer` when given, as vLLM's --tokenizer).

    A .gguf file (or a folder holding just one) uses the tokenizer embedded in the GGUF;
    anything else goes to transformers' AutoTokenizer (fast tokenizer preferred).
    """
    name = os.fspath(tokenizer if tokenizer is not None else source)
    gguf_file = _gguf_file_for(Path(name))
    if gguf_file is not None:
        # Imported lazily: the GGUF reader is only needed for GGUF models.
        from vllm_volta.transformers_utils.gguf_tokenizer import load_gguf_tokenizer
        return load_gguf_tokenizer(str(gguf_file))
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code,
                                            revision=revision, **kwargs)
    except ValueError as e:
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise ValueError(f"tokenizer {name!r} needs custom code; pass "
                             "trust_remote_code=True if you trust it.") from e
        raise
    except OSError as e:
        raise ValueError(f"tokenizer: cannot load {name!r} (not a tokenizer folder, GGUF file "
                         f"or reachable hub name): {e}") from e
    if not getattr(tok, "is_fast", False):
        logger.warning("Using a slow tokenizer for %s; detokenization will be slower.", name)
    return tok


def _content_text(content: Any, index: int) -> Any:
    """OpenAI content parts [{"type": "text", "text": ...}] -> one string (vLLM's
    "string" content format joins text parts with newlines)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ValueError(f"messages[{index}].content: only text parts are supported, "
                                 f"got {kind!r}.")
            texts.append(part.get("text", ""))
        return "\n".join(texts)
    raise ValueError(f"messages[{index}].content must be a string or a list of text parts.")


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts.")
    normalized = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"messages[{i}] must be a dict with a 'role' key, got {message!r}.")
        msg = dict(message)
        if "content" in msg:
            msg["content"] = _content_text(msg["content"], i)
        normalized.append(msg)
    return normalized


def _resolve_template(tokenizer, chat_template: str | os.PathLike | None) -> str:
    if chat_template is not None:
        candidate = os.fspath(chat_template)
        # A short single-line value that names a file is a path, as with vLLM's flag.
        if "\n" not in candidate and len(candidate) < 4096 and os.path.isfile(candidate):
            return Path(candidate).read_text(encoding="utf-8")
        return candidate
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("chat_template: the tokenizer defines no chat template; pass "
                         "chat_template (a Jinja string or a file path).")
    return template


def apply_chat_template(tokenizer, messages: Sequence[Mapping[str, Any]], *,
                        chat_template: str | os.PathLike | None = None,
                        add_generation_prompt: bool = True,
                        continue_final_message: bool = False,
                        tools: list[dict[str, Any]] | None = None,
                        tokenize: bool = False,
                        **template_kwargs: Any) -> str | list[int]:
    """Render one conversation with the tokenizer's (or the given) chat template.

    Returns the prompt text, or its token ids with tokenize=True; the ids are encoded
    without adding special tokens because the template already writes BOS where wanted.
    """
    if add_generation_prompt and continue_final_message:
        raise ValueError("add_generation_prompt and continue_final_message cannot both be "
                         "True.")
    conversation = _normalize_messages(messages)
    template = _resolve_template(tokenizer, chat_template)
    text = tokenizer.apply_chat_template(
        conversation, chat_template=template, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, tools=tools, tokenize=False,
        **template_kwargs)
    if not tokenize:
        return text
    return tokenizer.encode(text, add_special_tokens=False)
