"""IncrementalDetokenizer vs full tokenizer.decode on tiny in-test tokenizers:
split UTF-8 characters, special tokens, stop strings, streaming hold-back, min_tokens."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vllm_volta.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from vllm_volta.sampling_params import SamplingParams

CORPUS = ["The capital of France is Paris.", "Grüße aus München, ça va très bien!",
          "日本語のテキストと中文文本", "emoji 🙂🚀 mixed with text",
          "STOP here. The end\n\nNew line"] * 3
TEXTS = ["The capital of France is Paris. 日本語🙂", "Grüße! 中文 🚀 end", "ça va STOP là 🙂🙂",
         "München\n\nthe end 本文"]


def _byte_level_bpe() -> PreTrainedTokenizerFast:
    """GPT-2 style byte-level BPE; a tiny vocab splits CJK and emoji across tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


def _sentencepiece_like_bpe() -> PreTrainedTokenizerFast:
    """Llama style: '▁' for spaces, byte-fallback tokens, leading space stripped on decode."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=len(specials) + 150, special_tokens=specials, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


class _DecodeOnly:
    """A tokenizer exposing only decode(): exercises the generic (slow) path."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def decode(self, ids, skip_special_tokens=False, **kwargs) -> str:
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def byte_level() -> PreTrainedTokenizerFast:
    return _byte_level_bpe()


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece", "decode_only"])
def any_tokenizer(request, byte_level):
    if request.param == "byte_level":
        return byte_level
    if request.param == "sentencepiece":
        return _sentencepiece_like_bpe()
    return _DecodeOnly(byte_level)


def _stream(tok, prompt_ids, output_ids, params, finished_at_end=True):
    """Feed ids one by one; return (final text, streamed deltas, stop string, steps)."""
    detok = IncrementalDetokenizer(tok, prompt_ids, params)
    deltas, stop, steps = [], None, 0
    for token_id in output_ids:
        steps += 1
        stop = detok.update([token_id])
        deltas.append(detok.get_next_output_text(finished=stop is not None, delta=True))
        if stop is not None:
            break
    if stop is None and finished_at_end:
        deltas.append(detok.get_next_output_text(finished=True, delta=True))
    return detok.get_next_output_text(finished=True, delta=False), deltas, stop, steps


def _expected(tok, prompt_ids, output_ids, skip=True) -> str:
    """Reference: the text the output adds to the prompt in a full decode."""
    full = tok.decode(list(prompt_ids) + list(output_ids), skip_special_tokens=skip)
    prompt = tok.decode(list(prompt_ids), skip_special_tokens=skip)
    assert full.startswith(prompt)
    return full[len(prompt):]


@pytest.mark.parametrize("text", TEXTS)
def test_final_text_equals_full_decode(any_tokenizer, byte_level, text) -> None:
    encoder = any_tokenizer.inner if isinstance(any_tokenizer, _DecodeOnly) else any_tokenizer
    prompt_ids = encoder.encode("Q: say it.", add_special_tokens=False)
    output_ids = encoder.encode(text, add_special_tokens=False)
    final, deltas, stop, _ = _stream(any_tokenizer, prompt_ids, output_ids, SamplingParams())
    assert stop is None
    assert final == _expected(any_tokenizer, prompt_ids, output_ids)
    assert "".join(deltas) == final
    # Split characters are held back, never streamed as replacement characters.
    assert all("\ufffd" not in d for d in deltas)


def test_byte_level_output_equals_decode_of_output_ids(byte_level) -> None:
    for text in TEXTS:
        ids = byte_level.encode(text)
        assert _stream(byte_level, [], ids, SamplingParams())[0] == byte_level.decode(ids)


def test_random_ids_match_decode(byte_level) -> None:
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(len(byte_level)) for _ in range(rng.randrange(1, 30))]
        prompt = byte_level.encode("hello")
        final = _stream(byte_level, prompt, ids, SamplingParams())[0]
        assert final == _expected(byte_level, prompt, ids)


def test_cut_mid_character_is_flushed_at_finish(byte_level) -> None:
    ids = byte_level.encode("ok 🙂")
    partial = ids[:-1]  # the emoji's last byte-token is missing
    assert byte_level.decode(partial).endswith("\ufffd")
    final, deltas, _, _ = _stream(byte_level, [], partial, SamplingParams())
    assert final == byte_level.decode(partial) and deltas[-1].endswith("\ufffd")


def test_prompt_cut_mid_character_leaves_its_bytes_out(byte_level) -> None:
    """A prompt that ends inside a character: its stray bytes stay with the prompt (as in the
    full decode), not at the head of the output text."""
    prompt = byte_level.encode("say 🙂")[:-1]
    assert byte_level.decode(prompt).endswith("\ufffd")
    output = byte_level.encode(" no, fine")
    final, deltas, _, _ = _stream(byte_level, prompt, output, SamplingParams())
    assert final == _expected(byte_level, prompt, output) == byte_level.decode(output)
    assert "\ufffd" not in "".join(deltas)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(byte_level, skip) -> None:
    eos = byte_level.convert_tokens_to_ids("<|im_end|>")
    ids = byte_level.encode("Paris") + [eos] + byte_level.encode(" ok")
    params = SamplingParams(skip_special_tokens=skip)
    final = _stream(byte_level, byte_level.encode("Q"), ids, params)[0]
    assert final == byte_level.decode(ids, skip_special_tokens=skip)
    assert ("<|im_end|>" in final) == (not skip)


@pytest.mark.parametrize("stop, include", [
    (["STOP"], False), (["STOP"], True),   # spans tokens
    (["ap"], False),                       # inside a single token ("capital")
    (["Paris", "capital"], False),         # the earliest match wins, not the first listed
    (["本"], True),                         # a multi-byte character split over tokens
])
def test_stop_strings(byte_level, stop, include) -> None:
    text = "The capital of France is Paris. STOP 日本語 after"
    ids = byte_level.encode(text)
    params = SamplingParams(stop=stop, include_stop_str_in_output=include)
    final, deltas, got_stop, steps = _stream(byte_level, [], ids, params)
    first = min(stop, key=lambda s: text.find(s))
    cut = text.find(first) + (len(first) if include else 0)
    assert got_stop == first and final == text[:cut]
    # It fires at the first token whose text completes the stop string.
    assert first in byte_level.decode(ids[:steps])
    assert first not in byte_level.decode(ids[:steps - 1])
    assert "".join(deltas) == final


def test_streaming_holds_back_possible_stop_prefix(byte_level) -> None:
    text = "go ST then STO and STOP end"
    ids = byte_level.encode(text)
    params = SamplingParams(stop=["STOP"])
    detok = IncrementalDetokenizer(byte_level, [], params)
    streamed = ""
    for token_id in ids:
        stop = detok.update([token_id])
        if stop:
            break
        streamed += detok.get_next_output_text(finished=False, delta=True)
        # Never more than len("STOP") - 1 characters behind, never past the final text.
        assert len(detok.output_text) - len(streamed) <= 3
        assert "go ST then STO and ".startswith(streamed)
    assert stop == "STOP"
    streamed += detok.get_next_output_text(finished=True, delta=True)
    assert streamed == "go ST then STO and "


def test_min_tokens_ignores_early_stop_strings(byte_level) -> None:
    text = "STOP now STOP later"
    ids = byte_level.encode(text)
    n_first = next(i for i in range(1, len(ids) + 1) if "STOP" in byte_level.decode(ids[:i]))
    params = SamplingParams(stop=["STOP"], min_tokens=n_first, max_tokens=50)
    final, _, stop, _ = _stream(byte_level, [], ids, params)
    assert stop == "STOP" and final == "STOP now "


def test_detokenize_false_produces_no_text(byte_level) -> None:
    detok = IncrementalDetokenizer(byte_level, [1, 2], SamplingParams(detokenize=False))
    assert detok.update(byte_level.encode("abc")) is None
    assert detok.num_output_tokens == len(byte_level.encode("abc"))
    assert detok.get_next_output_text(finished=True, delta=False) == ""


def test_find_stop_string_respects_search_start() -> None:
    assert find_stop_string("abcXYabXY", ["XY"], 0) == ("XY", 3)
    assert find_stop_string("abcXYabXY", ["XY"], 5) == ("XY", 7)
    assert find_stop_string("abcXY", ["XY"], 5) is None
    assert find_stop_string("abcXY", ["XY"], 4) == ("XY", 3)  # ends after position 4


@pytest.fixture(scope="module")
def default_model_tokenizer(default_model_path):
    from vllm_volta.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(default_model_path)


def test_default_model_tokenizer(default_model_tokenizer) -> None:
    from vllm_volta.transformers_utils.tokenizer import apply_chat_template
    tok = default_model_tokenizer
    prompt = apply_chat_template(tok, [{"role": "user", "content": "Capital of France?"}],
                                 tokenize=True)
    text = "The capital of France is Paris. Grüße 日本語🙂"
    output = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    final, deltas, _, _ = _stream(tok, prompt, output, SamplingParams())
    assert final == text == tok.decode(output, skip_special_tokens=True)
    assert all("\ufffd" not in d for d in deltas)
    final, _, stop, _ = _stream(tok, prompt, output, SamplingParams(stop=["Paris", "日本"]))
    assert (final, stop) == ("The capital of France is ", "Paris")
