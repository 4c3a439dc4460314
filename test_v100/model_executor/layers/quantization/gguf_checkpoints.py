"""Random GGUF blocks and tiny quantized llama GGUF files for the GGUF tests.

Q4_0 / Q5_0 / Q8_0 blocks come from the gguf package's quantizers (of random float weights); it
has none for the K-quants, so Q4_K / Q5_K / Q6_K blocks are random bytes whose f16 super-block
scales are overwritten with small valid values (every other byte is a valid quant or sub-scale).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

# Byte offsets of the f16 super-block scales (d, dmin) in each K-quant block.
_K_SCALES = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
_QUANTIZED = (T.Q4_0, T.Q5_0, T.Q8_0)


def random_blocks(qtype: T, n: int, k: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """uint8 [n, row_bytes]: n rows of k weights in ``qtype`` blocks, weights of about ``scale``."""
    if qtype in _QUANTIZED:
        return gguf.quants.quantize((rng.standard_normal((n, k)) * scale).astype(np.float32), qtype)
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n, k // elems, nbytes), dtype=np.uint8)
    # |q * sub-scale| reaches ~1000 (Q4_K: 15 * 63; Q6_K: 32 * 127 / 4): d of ~scale / 500.
    d = (rng.uniform(0.2, 1.0, size=(n, k // elems, len(_K_SCALES[qtype]))) * scale / 500).astype(np.float16)
    for i, offset in enumerate(_K_SCALES[qtype]):
        blocks[:, :, offset:offset + 2] = d[:, :, i:i + 1].view(np.uint8)
    return blocks.reshape(n, -1)


# A llama with hidden 256 (one K-quant super-block per row of q / k / v / gate / up), intermediate
# 512, 4 heads of 64, 2 kv heads; per layer the GGUF type of each linear weight. Layer 0 mixes
# types inside q/k/v (v in Q6_K), layer 1 inside gate/up, and its down_proj is Q5_0 (not kept).
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 256, 512, 4, 2, 64, 384
LAYER_TYPES = [
    {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K, "attn_output": T.Q5_K,
     "ffn_gate": T.Q4_0, "ffn_up": T.Q4_0, "ffn_down": T.Q8_0},
    {"attn_q": T.Q8_0, "attn_k": T.Q8_0, "attn_v": T.Q8_0, "attn_output": T.Q6_K,
     "ffn_gate": T.Q5_K, "ffn_up": T.Q6_K, "ffn_down": T.Q5_0},
]
SHAPES = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
          "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
          "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER)}


def write_tiny_llama(path: Path, seed: int = 0, scale: float = 0.05,
                     layer_types: list[dict[str, T]] = LAYER_TYPES) -> Path:
    """A 2-layer llama GGUF file (no tokenizer) with the linear weights in ``layer_types``."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(len(layer_types))
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tensor("token_embd.weight", rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32))
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    w.add_tensor("output.weight", (rng.standard_normal((VOCAB, HIDDEN)) * scale).astype(np.float32))
    for i, types in enumerate(layer_types):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        for part, qtype in types.items():
            n, k = SHAPES[part]
            w.add_tensor(f"blk.{i}.{part}.weight", random_blocks(qtype, n, k, rng, scale), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
