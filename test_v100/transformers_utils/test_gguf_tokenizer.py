"""load_gguf_tokenizer: the default model's byte-level BPE against transformers' own GGUF
tokenizer, its chat template, pre-tokenizer choices, and the SentencePiece fallback."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from vllm_volta.transformers_utils.gguf_tokenizer import load_gguf_tokenizer

_TEXTS = [
    "The capital of France is",
    "Hello, world!  Multiple   spaces\n\nnew lines\ttabs ",
    "héllo wörld, 日本語 and emoji 🙂👍🏽",
    "don't, I'll, we've, THEY'RE",
    "def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.fixture(scope="module")
def smol_tok(default_model_path) -> PreTrainedTokenizerBase:
    return load_gguf_tokenizer(default_model_path)


@pytest.fixture(scope="module")
def hf_gguf_tok(default_model_path) -> PreTrainedTokenizerBase:
    """transformers' own tokenizer for the same GGUF file (independent reference)."""
    path = Path(default_model_path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_token_ids_match_transformers(smol_tok, hf_gguf_tok):
    assert len(smol_tok) == len(hf_gguf_tok) == 49152
    for text in _TEXTS:
        assert smol_tok(text).input_ids == hf_gguf_tok(text).input_ids, text
    assert smol_tok("The capital of France is").input_ids == [504, 3575, 282, 4649, 314]


@pytest.mark.parametrize("text", _TEXTS)
def test_round_trip(smol_tok, text: str):
    assert smol_tok.decode(smol_tok(text).input_ids) == text


def test_special_tokens(smol_tok):
    assert (smol_tok.bos_token, smol_tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (smol_tok.bos_token_id, smol_tok.eos_token_id) == (1, 2)
    assert smol_tok.unk_token == "<|endoftext|>" and smol_tok.pad_token_id == 2
    # Control tokens encode as one id and are dropped by skip_special_tokens.
    ids = smol_tok("<|im_start|>assistant\nHi<|im_end|>").input_ids
    assert ids[0] == 1 and ids[-1] == 2
    assert smol_tok.decode(ids, skip_special_tokens=True) == "assistant\nHi"
    assert smol_tok("x").input_ids[0] != 1  # add_bos_token is false for SmolLM2


def test_digits_split_one_per_token(smol_tok):
    # SmolLM's pre-tokenizer ("smollm") isolates every digit, as its tokenizer.json does.
    pieces = smol_tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("year 2024!")
    assert [p for p, _ in pieces] == ["year", "Ġ", "2", "0", "2", "4", "!"]


def test_chat_template_renders_chatml(smol_tok):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with_prompt = smol_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert with_prompt.startswith("<|im_start|>system\n")
    assert with_prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    without = smol_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without.endswith("What is the capital of France?<|im_end|>\n")
    system = [{"role": "system", "content": "Be brief."}] + messages
    rendered = smol_tok.apply_chat_template(system, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def _write_vocab(path: Path, model: str, tokens: list[str], types: list[int], **kv) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, value in kv.items():
        getattr(w, f"add_{key}")(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _byte_vocab(tmp_path: Path, pre: str, add_bos: bool) -> PreTrainedTokenizerBase:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|bos|>", "<|eos|>", *alphabet, "Ġa", "Ġab"]
    types = [3, 3] + [1] * (len(tokens) - 2)
    path = _write_vocab(tmp_path / f"{pre}.gguf", "gpt2", tokens, types, tokenizer_pre=pre,
                        token_merges=["Ġ a", "Ġa b"], bos_token_id=0, eos_token_id=1,
                        add_bos_token=add_bos)  # fmt: skip
    return load_gguf_tokenizer(path)


@pytest.mark.parametrize(
    "pre,expected",
    [
        ("llama-bpe", ["x", "Ġ", "123", "45", "Ġab"]),  # Llama 3: digit groups of three
        ("qwen2", ["x", "Ġ", "1", "2", "3", "4", "5", "Ġab"]),  # Qwen2: single digits
        ("gpt2", ["x", "Ġ12345", "Ġab"]),
    ],
)
def test_pre_tokenizer_follows_gguf_pre(tmp_path: Path, pre: str, expected: list[str]):
    tok = _byte_vocab(tmp_path, pre, add_bos=False)
    pieces = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x 12345 ab")
    assert [p for p, _ in pieces] == expected


def test_add_bos_token_prepends_bos(tmp_path: Path):
    tok = _byte_vocab(tmp_path, "llama-bpe", add_bos=True)
    ids = tok(" ab a").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["<|bos|>", "Ġab", "Ġa"]
    assert tok.decode(ids, skip_special_tokens=True) == " ab a"


def test_sentencepiece_vocab_goes_through_transformers(tmp_path: Path):
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    tokens += ["▁", "a", "b", "▁a", "▁b", "ab", "▁ab"]
    types = [2, 3, 3] + [6] * 256 + [1] * 7
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    path = _write_vocab(tmp_path / "spm.gguf", "llama", tokens, types, token_scores=scores,
                        bos_token_id=1, eos_token_id=2, unk_token_id=0,
                        add_bos_token=True)  # fmt: skip
    tok = load_gguf_tokenizer(path)
    ids = tok("ab a b").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["<s>", "▁ab", "▁a", "▁b"]
    assert tok.decode(ids, skip_special_tokens=True) == "ab a b"


def test_gguf_without_vocab_is_an_error(tmp_path: Path):
    w = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_gguf_tokenizer(tmp_path / "n.gguf")
