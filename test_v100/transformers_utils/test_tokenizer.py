"""get_tokenizer (HF folder, override, GGUF routing) and apply_chat_template."""

from __future__ import annotations

import sys
import types

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vllm_volta.transformers_utils.tokenizer import apply_chat_template, get_tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tiny_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world", "what is the capital of France?"] * 4,
                            trainers.BpeTrainer(
                                vocab_size=280, special_tokens=["<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 bos_token="<|im_start|>")
    hf.chat_template = chat_template
    return hf


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    _tiny_tokenizer(CHATML).save_pretrained(folder)
    return folder


def test_loads_hf_folder(saved_folder) -> None:
    tok = get_tokenizer(str(saved_folder))
    ref = _tiny_tokenizer()
    assert tok.is_fast
    assert tok.encode("hello world?") == ref.encode("hello world?")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template == CHATML


def test_tokenizer_override_wins(saved_folder, tmp_path) -> None:
    tok = get_tokenizer(tmp_path / "model-without-tokenizer", tokenizer=saved_folder)
    assert tok.eos_token == "<|im_end|>"


def test_missing_tokenizer_is_value_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        get_tokenizer(str(tmp_path / "nope"))


def test_gguf_paths_route_to_gguf_loader(tmp_path, monkeypatch) -> None:
    calls = []
    fake = types.ModuleType("vllm_volta.transformers_utils.gguf_tokenizer")
    fake.load_gguf_tokenizer = lambda path: calls.append(path) or "gguf-tokenizer"
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    gguf = tmp_path / "model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    assert get_tokenizer(gguf) == "gguf-tokenizer"
    # A folder holding a single GGUF and no HF tokenizer files uses that GGUF.
    assert get_tokenizer(tmp_path) == "gguf-tokenizer"
    assert calls == [str(gguf), str(gguf)]


MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"}]
EXPECTED = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?"
            "<|im_end|>\n")


def test_chat_template_from_tokenizer() -> None:
    tok = _tiny_tokenizer(CHATML)
    assert apply_chat_template(tok, MESSAGES) == EXPECTED + "<|im_start|>assistant\n"
    assert apply_chat_template(tok, MESSAGES, add_generation_prompt=False) == EXPECTED
    ids = apply_chat_template(tok, MESSAGES, tokenize=True)
    # No extra special tokens beyond what the template wrote.
    assert ids == tok.encode(EXPECTED + "<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids[1] != ids[0]


def test_chat_template_override_string_and_file(tmp_path) -> None:
    tok = _tiny_tokenizer(None)
    simple = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert apply_chat_template(tok, MESSAGES, chat_template=simple) == \
        "[system]Be brief.[user]Capital of France?"
    path = tmp_path / "t.jinja"
    path.write_text(CHATML)
    assert apply_chat_template(tok, MESSAGES, chat_template=str(path),
                               add_generation_prompt=False) == EXPECTED


def test_missing_template_is_clear_error() -> None:
    with pytest.raises(ValueError, match="chat_template"):
        apply_chat_template(_tiny_tokenizer(None), MESSAGES)


def test_openai_content_parts_are_joined() -> None:
    tok = _tiny_tokenizer(CHATML)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    assert apply_chat_template(tok, parts, add_generation_prompt=False) == \
        "<|im_start|>user\na\nb<|im_end|>\n"
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        apply_chat_template(tok, [{"role": "user", "content": [{"type": "image_url"}]}])


@pytest.mark.parametrize("bad", ["hello", [{"content": "no role"}], [["user", "x"]]])
def test_malformed_messages(bad) -> None:
    with pytest.raises(ValueError, match="messages"):
        apply_chat_template(_tiny_tokenizer(CHATML), bad)


def test_generation_prompt_and_continue_are_exclusive() -> None:
    with pytest.raises(ValueError, match="continue_final_message"):
        apply_chat_template(_tiny_tokenizer(CHATML), MESSAGES, continue_final_message=True)
