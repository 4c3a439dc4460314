"""benchmarks/synthetic_tokenizer.py: a loadable tokenizer of the config's vocabulary size whose
every id decodes, so a random-weight model's outputs detokenize as a real server's do."""
from __future__ import annotations

import json
import random

import pytest
from tokenizers.pre_tokenizers import ByteLevel

from benchmarks.synthetic_tokenizer import EOS, build_tokenizer, main
from vllm_volta.engine.detokenizer import IncrementalDetokenizer
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.transformers_utils.tokenizer import get_tokenizer


def test_vocabulary_layout_and_decoding():
    tok = build_tokenizer(1000, seed=1)
    vocab = tok.get_vocab()
    assert tok.get_vocab_size() == len(vocab) == 1000
    assert tok.token_to_id(EOS) == 999
    assert sorted(vocab.values()) == list(range(1000))
    assert {tok.id_to_token(i) for i in range(256)} == set(ByteLevel.alphabet())
    # A piece with the byte-level space symbol decodes to a leading space.
    spaced = next(i for i in range(256, 999) if tok.id_to_token(i).startswith("\u0120"))
    assert tok.decode([spaced]) == " " + tok.id_to_token(spaced)[1:]
    assert build_tokenizer(1000, seed=1).get_vocab() == vocab  # deterministic
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(100)


def test_the_server_loads_it_and_detokenizes_incrementally(tmp_path, capsys):
    config = tmp_path / "model"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"vocab_size": 3000}))
    main([str(tmp_path / "tok"), "--config", str(config)])
    assert json.loads(capsys.readouterr().out)["vocab_size"] == 3000
    tok = get_tokenizer(str(tmp_path / "tok"))
    assert len(tok) == 3000 and tok.eos_token_id == 2999
    rng = random.Random(0)
    prompt = [rng.randrange(256, 2999) for _ in range(8)]
    out = [rng.randrange(2999) for _ in range(200)]
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(max_tokens=200))
    for token_id in out:
        detok.update([token_id])
    assert detok.get_next_output_text(True, delta=False) == tok.decode(out)
