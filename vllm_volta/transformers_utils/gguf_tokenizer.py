"""Build a HF fast tokenizer from the vocabulary stored in a GGUF file.

Byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``: SmolLM2, Llama 3, Qwen2/3) are
rebuilt here with ``tokenizers``: tokens, merges, token types (control tokens become special
added tokens), bos/eos/unk/pad, the chat template, and the pre-tokenizer that llama.cpp's
``tokenizer.ggml.pre`` names -- the regex the merges were learned with, including SmolLM's
one-token-per-digit split. Other vocabularies (SentencePiece ``llama``) go through
transformers' own GGUF support.
"""

from __future__ import annotations

import os
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from vllm_volta.logger import init_logger
from vllm_volta.model_executor.model_loader.gguf_config import GGUFFile, open_gguf

__all__ = ["load_gguf_tokenizer"]

logger = init_logger(__name__)

# Split regexes as written by the models' own tokenizer.json files / llama.cpp.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGIT_SPLIT = r"\p{N}"

# tokenizer.ggml.pre -> the regexes applied in order (each piece is split again by the next).
_PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt2": (_GPT2_SPLIT,),
    "gpt-2": (_GPT2_SPLIT,),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
    "llama-v3": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,),
    "dbrx": (_LLAMA3_SPLIT,),
    "falcon3": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
    "deepseek-r1-qwen": (_QWEN2_SPLIT,),
    "smollm": (_DIGIT_SPLIT, _GPT2_SPLIT),
    "starcoder": (_DIGIT_SPLIT, _GPT2_SPLIT),
    "refact": (_DIGIT_SPLIT, _GPT2_SPLIT),
    "codeshell": (_DIGIT_SPLIT, _GPT2_SPLIT),
}
# Llama 3's tokenizer.json sets ignore_merges: a piece that is itself a token is used whole.
_IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3"}

# llama.cpp token types.
_CONTROL, _USER_DEFINED, _UNUSED = 3, 4, 5


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    splits = _PRE_TOKENIZER_SPLITS.get(pre or "default")
    if splits is None:
        logger.warning("Unknown GGUF pre-tokenizer %r; using GPT-2's split regex", pre)
        splits = (_GPT2_SPLIT,)
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits
    ]
    # The regexes above did the splitting; ByteLevel only maps bytes to its printable alphabet.
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _special_token(tokens: list[str], meta: dict[str, Any], key: str) -> str | None:
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    if token_id is None or not 0 <= int(token_id) < len(tokens):
        return None
    return tokens[int(token_id)]


def _byte_level_bpe(gguf: GGUFFile) -> PreTrainedTokenizerFast:
    meta = gguf.metadata
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
    pre = meta.get("tokenizer.ggml.pre")

    bpe = models.BPE(
        vocab={tok: i for i, tok in enumerate(tokens)},
        merges=merges,
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=pre in _IGNORE_MERGES,
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=ty == _CONTROL, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_tokens(added)

    bos = _special_token(tokens, meta, "bos")
    eos = _special_token(tokens, meta, "eos")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tok.post_processor = _bos_processor(bos, tokens.index(bos))
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token=_special_token(tokens, meta, "unknown"),
        pad_token=_special_token(tokens, meta, "padding"),
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=int(gguf.arch_value("context_length", 0) or int(1e30)),
        clean_up_tokenization_spaces=False,
    )


def _bos_processor(bos: str, bos_id: int) -> processors.TemplateProcessing:
    """Prepend BOS to every sequence (GGUF's tokenizer.ggml.add_bos_token)."""
    return processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                         special_tokens=[(bos, bos_id)])


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """Return the HF tokenizer (with chat template) stored in the GGUF file at ``path``."""
    gguf = open_gguf(path)
    kind = gguf.metadata.get("tokenizer.ggml.model")
    if kind is None or "tokenizer.ggml.tokens" not in gguf.metadata:
        raise ValueError(f"GGUF file {gguf.path.name} has no tokenizer; pass tokenizer=...")
    if kind == "gpt2":
        return _byte_level_bpe(gguf)
    # SentencePiece-style vocabularies: transformers converts them (scores -> merges).
    logger.info("Building the %r GGUF tokenizer through transformers", kind)
    tok = AutoTokenizer.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    # transformers versions differ on honouring add_bos_token for these; the GGUF decides.
    if (gguf.metadata.get("tokenizer.ggml.add_bos_token") and tok.bos_token_id is not None
            and tok.is_fast and tok("a").input_ids[:1] != [tok.bos_token_id]):
        tok.backend_tokenizer.post_processor = _bos_processor(tok.bos_token, tok.bos_token_id)
    return tok
