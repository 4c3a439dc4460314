"""A byte-level BPE tokenizer of a model config's vocabulary size, for benchmarks that should
pay for detokenization as a real server does (the random-weight models ship no tokenizer).

Its tokens are the 256 byte symbols, then random word pieces (most with a leading space, as
in GPT-2 style vocabularies), then one special token, ``<|endoftext|>``, as eos. Decoding any
id gives text, so every sampled id of a random-weight model detokenizes; encoding is only
byte by byte (no merges), which the benchmarks do not need: their prompts are token ids.

    python benchmarks/synthetic_tokenizer.py --config qwen2.5-1.5b OUT_DIR
    python benchmarks/benchmark_serving.py --config qwen2.5-1.5b --tokenizer OUT_DIR ...
"""
from __future__ import annotations

import argparse
import json
import random
import string
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    # The repository root replaces the script's folder: benchmarks/kernels/ there would shadow the
    # PyPI `kernels` package that transformers imports.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402

EOS = "<|endoftext|>"
_LETTERS = string.ascii_lowercase + string.ascii_uppercase + string.digits


def _word_pieces(count: int, seed: int, taken: set[str]) -> list[str]:
    rng = random.Random(seed)
    pieces: list[str] = []
    while len(pieces) < count:
        piece = "".join(rng.choices(_LETTERS, k=rng.randint(2, 8)))
        if rng.random() < 0.6:
            piece = "\u0120" + piece  # the byte-level symbol of a leading space
        if piece not in taken:
            taken.add(piece)
            pieces.append(piece)
    return pieces


def build_tokenizer(vocab_size: int, seed: int = 0) -> Tokenizer:
    """The tokenizer: ids 0-255 are bytes, vocab_size - 1 is eos."""
    if vocab_size < 258:
        raise ValueError(f"vocab_size must be at least 258 (bytes, a piece, eos), got {vocab_size}")
    symbols = sorted(ByteLevel.alphabet(), key=lambda ch: ord(ch))
    pieces = _word_pieces(vocab_size - len(symbols) - 1, seed, set(symbols))
    vocab = {token: i for i, token in enumerate(symbols + pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    assert tok.get_vocab_size() == vocab_size and tok.token_to_id(EOS) == vocab_size - 1
    return tok


def write_tokenizer(out_dir: str | Path, vocab_size: int, seed: int = 0) -> Path:
    """Write tokenizer.json and tokenizer_config.json (loadable by AutoTokenizer) to out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(vocab_size, seed).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS,
        "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}, indent=1))
    return out


def main(argv: list[str] | None = None) -> None:
    from benchmarks.utils import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--config", default="qwen2.5-1.5b",
                        help="a shipped config name or a folder with config.json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = json.loads((Path(resolve_model(None, args.config)) / "config.json").read_text())
    out = write_tokenizer(args.out_dir, config["vocab_size"], args.seed)
    print(json.dumps({"tokenizer": str(out), "vocab_size": config["vocab_size"]}))


if __name__ == "__main__":
    main()
