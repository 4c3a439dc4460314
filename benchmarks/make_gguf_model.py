"""Write a random-weight llama GGUF file of a shipped config, quantized like llama.cpp's Q4_K_M (or
one type throughout), for end-to-end decode benchmarks of GGUF models kept in their blocks.

    python benchmarks/make_gguf_model.py --config llama-3-8b --quant Q4_K_M /tmp/llama3-q4km.gguf
    python benchmarks/synthetic_tokenizer.py --config llama-3-8b /tmp/tok
    python benchmarks/benchmark_latency.py --model /tmp/llama3-q4km.gguf --tokenizer /tmp/tok \\
        --dtype half --batch-size 1 --input-len 128 --output-len 256
    python benchmarks/benchmark_latency.py --config llama-3-8b --dtype half --batch-size 1 \\
        --input-len 128 --output-len 256        # the float16 baseline

Q4_K_M as llama.cpp assigns it: Q4_K everywhere except attn_v and ffn_down in Q6_K on the first
and last eighth of the layers and every third layer between, and the output head in Q6_K. Block
bytes are random, super-block scales small valid float16s (no NaN / inf). The token embedding is
float16 (it is dequantized at load anyway). A tensor whose rows are not whole blocks of its type
falls back to Q8_0 (as llama.cpp does), then to float16.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFWriter  # noqa: E402

from benchmarks.utils import log, resolve_model  # noqa: E402

QUANTS = ("Q4_K_M", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
_SCALE_OFFSETS = {T.Q4_0: (0,), T.Q8_0: (0,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
_PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="llama-3-8b", help="shipped llama config name or a config.json path")
    p.add_argument("--quant", default="Q4_K_M", choices=QUANTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("output", help="the .gguf file to write")
    return p.parse_args(argv)


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for the layers whose attn_v / ffn_down get Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(quant: str, part: str, layer: int, layers: int) -> T:
    if quant != "Q4_K_M":
        return T[quant]
    if part == "output":
        return T.Q6_K
    if part in ("attn_v", "ffn_down") and more_bits(layer, layers):
        return T.Q6_K
    return T.Q4_K


def random_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray | None:
    """uint8 [rows, row_bytes] of random ``qtype`` blocks with small valid scales; None when the
    rows are not whole blocks."""
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    if cols % elems:
        return None
    blocks = rng.integers(0, 256, size=(rows, cols // elems, nbytes), dtype=np.uint8)
    # Weights of ~0.02: |q * sub-scale| reaches ~1000 in the K-quants, 8-127 in the others.
    d_max = 4e-5 if qtype in (T.Q4_K, T.Q5_K, T.Q6_K) else 2e-3
    for offset in _SCALE_OFFSETS[qtype]:
        d = rng.uniform(0.2 * d_max, d_max, size=(rows, cols // elems, 1)).astype(np.float16)
        blocks[:, :, offset:offset + 2] = d.view(np.uint8)
    return blocks.reshape(rows, -1)


def add_weight(w: GGUFWriter, name: str, qtype: T, shape: tuple[int, int], rng: np.random.Generator) -> T:
    """Add a random [rows, cols] weight in ``qtype`` (else Q8_0, else float16); returns its type."""
    for candidate in (qtype, T.Q8_0):
        blocks = random_blocks(candidate, *shape, rng)
        if blocks is not None:
            w.add_tensor(name, blocks, raw_dtype=candidate)
            return candidate
    w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))
    return T.F16


def write_model(config: dict[str, Any], quant: str, path: Path, seed: int = 0) -> dict[str, int]:
    """Write the GGUF file; returns how many tensors each type got."""
    rng = np.random.default_rng(seed)
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    vocab = config["vocab_size"]
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(config.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    w.add_rope_dimension_count(head_dim)
    w.add_bos_token_id(int(config.get("bos_token_id", 1)))
    w.add_eos_token_id(int(config.get("eos_token_id", 2)))
    counts: dict[str, int] = {}

    def count(t: T) -> None:
        counts[t.name] = counts.get(t.name, 0) + 1

    w.add_tensor("token_embd.weight", (rng.standard_normal((vocab, hidden)) * 0.02).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    count(add_weight(w, "output.weight", tensor_type(quant, "output", 0, layers), (vocab, hidden), rng))
    shapes = {"attn_q": (heads * head_dim, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, heads * head_dim),
              "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden), "ffn_down": (hidden, inter)}
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
        for part in _PARTS:
            count(add_weight(w, f"blk.{i}.{part}.weight", tensor_type(quant, part, i, layers), shapes[part], rng))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    args = parse_args(argv)
    config = json.loads((Path(resolve_model(None, args.config)) / "config.json").read_text())
    if config.get("model_type", "llama") != "llama":
        raise ValueError(f"--config: {args.config!r} is a {config.get('model_type')!r} model; this writes llama only")
    counts = write_model(config, args.quant, Path(args.output), args.seed)
    log(f"wrote {args.output} ({args.quant}): {counts}, {Path(args.output).stat().st_size / 2**30:.2f} GiB")
    return counts


if __name__ == "__main__":
    main()
