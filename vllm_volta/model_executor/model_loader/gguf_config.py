"""Read a GGUF file's metadata and turn it into a transformers config.

``open_gguf`` parses a file once (parsing a 50k-token vocabulary takes seconds) and is shared by
the config, tokenizer and weight readers. ``load_gguf_config`` maps llama.cpp's metadata keys
(``{arch}.embedding_length``, ``{arch}.attention.head_count``, ...) onto the same
``PretrainedConfig`` that the model's HF ``config.json`` would give.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField
from transformers import LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

__all__ = ["GGUFFile", "SUPPORTED_GGUF_ARCHITECTURES", "load_gguf_config", "open_gguf"]

# GGUF architecture -> (config class, HF architecture name).
_ARCHITECTURES: dict[str, tuple[type[PretrainedConfig], str]] = {
    "llama": (LlamaConfig, "LlamaForCausalLM"),
    "qwen2": (Qwen2Config, "Qwen2ForCausalLM"),
    "qwen3": (Qwen3Config, "Qwen3ForCausalLM"),
}
SUPPORTED_GGUF_ARCHITECTURES: tuple[str, ...] = tuple(_ARCHITECTURES)


@dataclass(frozen=True)
class GGUFFile:
    """One parsed GGUF file: its reader (tensors are memory-mapped), decoded metadata, and
    tensor shapes in torch order (GGUF lists dimensions fastest first, torch slowest first)."""

    path: Path
    reader: GGUFReader
    metadata: dict[str, Any]
    tensor_shapes: dict[str, tuple[int, ...]]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """The architecture-scoped key ``{arch}.{key}``, e.g. ``attention.head_count``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def _scalar(part: np.ndarray, vtype: GGUFValueType) -> Any:
    if vtype == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    value = part[0].item()
    if vtype == GGUFValueType.BOOL:
        return bool(value)
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        # Shortest repr that round-trips in the stored precision: 1e-05, not 9.99999974e-06.
        return float(str(part[0]))
    return value


def _field_value(field: ReaderField) -> Any:
    """Decode one metadata field (scalars, strings, and arrays of either)."""
    if not field.types:
        return None
    if field.types[0] == GGUFValueType.ARRAY:
        if len(field.types) > 1 and field.types[1] == GGUFValueType.ARRAY:
            return None  # nested arrays are not used by any key we read
        return [_scalar(field.parts[i], field.types[-1]) for i in field.data]
    return _scalar(field.parts[field.data[0]], field.types[0])


@functools.lru_cache(maxsize=2)
def _open_cached(path: str, mtime_ns: int, size: int) -> GGUFFile:
    reader = GGUFReader(path, "r")
    metadata = {name: _field_value(field) for name, field in reader.fields.items()}
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    return GGUFFile(Path(path), reader, metadata, shapes)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse (or reuse the cached parse of) the GGUF file at ``path``."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise ValueError(f"model: GGUF file {str(path)!r} does not exist")
    try:
        stat = p.stat()
        return _open_cached(str(p), stat.st_mtime_ns, stat.st_size)
    except (ValueError, OSError) as exc:
        raise ValueError(f"model: {str(path)!r} is not a readable GGUF file: {exc}") from exc


def _uniform(name: str, value: Any) -> Any:
    """Per-layer arrays (some converters write head counts per layer) must be uniform here."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"GGUF metadata {name}: per-layer values {value} are not supported")
        return value[0]
    return value


def _required(gguf: GGUFFile, key: str) -> Any:
    value = gguf.arch_value(key)
    if value is None:
        raise ValueError(f"GGUF file {gguf.path.name}: metadata {gguf.architecture}.{key} missing")
    return _uniform(f"{gguf.architecture}.{key}", value)


def _llama3_factors(
    theta: float, head_dim: int, factor: float, low: float, high: float, orig: int
) -> np.ndarray:
    """llama.cpp's ``rope_freqs`` for Llama-3 scaling: the divisor applied to each frequency."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1 - smooth) / factor + smooth)


def _llama3_rope_scaling(
    rope_freqs: np.ndarray, theta: float, head_dim: int
) -> dict[str, Any]:
    """Recover HF's ``llama3`` rope_scaling from the ``rope_freqs`` tensor llama.cpp stores.

    The tensor fixes ``factor`` (its maximum); the other three parameters are found by checking
    the usual values against it, so a mismatch is an error rather than a silently wrong rope.
    """
    factor = float(np.float32(rope_freqs.max()))
    for orig in (8192, 4096, 16384, 32768, 2048, 131072):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0), (2.0, 8.0)):
            expected = _llama3_factors(theta, head_dim, factor, low, high, orig)
            if expected.shape == rope_freqs.shape and np.allclose(expected, rope_freqs, rtol=1e-4):
                return {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": orig,
                }
    raise ValueError("GGUF tensor rope_freqs.weight does not match any llama3 rope scaling")


def _rope_scaling(gguf: GGUFFile, theta: float, head_dim: int) -> dict[str, Any] | None:
    kind = gguf.arch_value("rope.scaling.type")
    factor = gguf.arch_value("rope.scaling.factor")
    if "rope_freqs.weight" in gguf.tensor_shapes:
        from vllm_volta.model_executor.model_loader.gguf_dequant import dequantize

        t = next(t for t in gguf.reader.tensors if t.name == "rope_freqs.weight")
        freqs = dequantize(t.data, t.tensor_type, gguf.tensor_shapes[t.name], name=t.name)
        return _llama3_rope_scaling(freqs.double().numpy(), theta, head_dim)
    if kind in (None, "none") or factor in (None, 1.0):
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"GGUF metadata rope.scaling.type={kind!r}: supported: linear, yarn")
    scaling: dict[str, Any] = {"rope_type": kind, "factor": float(factor)}
    orig = gguf.arch_value("rope.scaling.original_context_length")
    if orig is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    for key in ("beta_fast", "beta_slow"):
        value = gguf.arch_value(f"rope.scaling.yarn_{key}")
        if value is not None:
            scaling[key] = float(value)
    return scaling


def _vocab_size(gguf: GGUFFile) -> int:
    # The embedding's rows are authoritative: they are what the weights index.
    shape = gguf.tensor_shapes.get("token_embd.weight")
    if shape is not None:
        return int(shape[0])
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    return int(gguf.arch_value("vocab_size") or len(tokens or ()))


def load_gguf_config(path: str | os.PathLike[str]) -> PretrainedConfig:
    """Build the transformers config (Llama / Qwen2 / Qwen3) described by a GGUF file.

    Tied embeddings are inferred from the absence of an ``output.weight`` tensor; Llama-3 rope
    scaling from the ``rope_freqs`` tensor; linear/YaRN scaling from ``rope.scaling.*``.
    """
    gguf = open_gguf(path)
    arch = gguf.architecture
    if arch not in _ARCHITECTURES:
        raise ValueError(
            f"GGUF file {gguf.path.name}: architecture {arch!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    config_cls, hf_arch = _ARCHITECTURES[arch]
    hidden = int(_required(gguf, "embedding_length"))
    heads = int(_required(gguf, "attention.head_count"))
    kv_heads = int(_uniform("head_count_kv", gguf.arch_value("attention.head_count_kv", heads)))
    head_dim = int(gguf.arch_value("attention.key_length", hidden // heads))
    theta = float(gguf.arch_value("rope.freq_base", 10000.0))
    kwargs: dict[str, Any] = dict(
        architectures=[hf_arch],
        vocab_size=_vocab_size(gguf),
        hidden_size=hidden,
        intermediate_size=int(_required(gguf, "feed_forward_length")),
        num_hidden_layers=int(_required(gguf, "block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=int(gguf.arch_value("context_length", 2048)),
        rms_norm_eps=float(_required(gguf, "attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        rope_scaling=_rope_scaling(gguf, theta, head_dim),
        tie_word_embeddings="output.weight" not in gguf.tensor_shapes,
        hidden_act="silu",
        # Linear weights stay in their GGUF blocks on CUDA (layers/quantization/gguf.py).
        quantization_config={"quant_method": "gguf"},
    )
    for key in ("bos", "eos", "padding"):
        token_id = gguf.metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            kwargs["pad_token_id" if key == "padding" else f"{key}_token_id"] = int(token_id)
    if arch == "llama":
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in gguf.tensor_shapes
    if arch == "qwen2":
        kwargs.pop("head_dim")  # Qwen2 derives it from hidden_size / heads
    return config_cls(**kwargs)
