"""Stream a GGUF checkpoint's weights as HF-named, dequantized torch tensors.

``iterate_gguf_weights`` feeds a model's ``load_weights`` exactly what a safetensors checkpoint
of the same model would: HF parameter names, torch-order shapes, and -- for llama-architecture
files -- q/k projections in HF's row order.

Why the q/k rows differ: HF Llama applies rotary embeddings with ``rotate_half`` (dimension i of
a head pairs with i + d/2), llama.cpp pairs adjacent dimensions (2i with 2i+1). llama.cpp's
converter therefore reorders each head's rows from ``[2, d/2]`` (half, i) to ``[d/2, 2]``
(i, half). ``unpermute_qk`` is the inverse: view each head's rows as ``[d/2, 2]`` and
transpose back to ``[2, d/2]``. Only llama-arch files are permuted; Qwen2/Qwen3 files keep HF
order (llama.cpp runs them with NeoX-style rope).

With ``keep_quantized`` (the default on a CUDA device) the linear layers' weights of the types the
CUDA kernels read (gguf_blocks.KEPT_TYPES) come as their GGUF blocks, uint8 [N, row_bytes] tagged
with the type (gguf_blocks.py), for the GGUF linear method (layers/quantization/gguf.py); the
permutation above moves whole rows, so it applies to blocks as it does to values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from vllm_volta.logger import init_logger
from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config, open_gguf
from vllm_volta.model_executor.model_loader.gguf_blocks import KEPT_TYPES, row_bytes, tag_blocks
from vllm_volta.model_executor.model_loader.gguf_dequant import _as_uint8, dequantize

__all__ = ["iterate_gguf_weights", "gguf_to_hf_name", "unpermute_qk"]

logger = init_logger(__name__)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Tensors that carry no model parameter: llama3 rope factors are read into the config instead.
_SKIPPED = {"rope_freqs.weight"}
# Architectures whose q/k rows llama.cpp's converter permuted.
_PERMUTED_ARCHS = {"llama"}
# llama.cpp parts whose weight is a linear layer's (kept in blocks on CUDA).
_LINEAR_PARTS = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}


def gguf_to_hf_name(name: str) -> str:
    """Map a llama.cpp tensor name to the HF parameter name (ValueError if it has none)."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER_RE.match(name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    raise ValueError(f"GGUF tensor {name!r} has no equivalent HF parameter")


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of a q/k projection (weight or bias).

    ``num_heads`` is the number of heads the rows belong to (kv heads for ``k_proj``).
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"q/k projection with {rows} rows cannot hold {num_heads} heads")
    half = rows // num_heads // 2
    per_head = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return per_head.transpose(1, 2).reshape(weight.shape)


def iterate_gguf_weights(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    use_tqdm: bool = True,
    keep_quantized: bool | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every weight in the GGUF file at ``path``.

    Quantized tensors are dequantized to float32 (F16/BF16/F32 keep their stored dtype) unless
    ``dtype`` is given. ``device`` chooses where the bytes are decoded (a GPU is faster for big
    models). Unsupported quantization types raise ValueError naming the tensor.
    ``keep_quantized`` (default: whether ``device`` is a CUDA device) yields linear weights of
    the kept types as tagged GGUF blocks on ``device`` instead (module docstring).
    """
    if keep_quantized is None:
        keep_quantized = device is not None and torch.device(device).type == "cuda"
    gguf = open_gguf(path)
    config = load_gguf_config(path)
    permute = gguf.architecture in _PERMUTED_ARCHS
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    tensors = [t for t in gguf.reader.tensors if t.name not in _SKIPPED]
    logger.info("Loading %d GGUF tensors from %s", len(tensors), gguf.path.name)
    for t in tqdm(tensors, desc="Loading GGUF weights", unit="tensor", disable=not use_tqdm):
        hf_name = gguf_to_hf_name(t.name)
        shape = gguf.tensor_shapes[t.name]
        part = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        blocks = (keep_quantized and part in _LINEAR_PARTS and t.name.endswith(".weight")
                  and len(shape) == 2 and t.tensor_type in KEPT_TYPES)
        if blocks:
            weight = _blocks(t.data, t.tensor_type, shape, t.name, device)
        else:
            weight = dequantize(t.data, t.tensor_type, shape, name=t.name, device=device)
        if permute and part in heads:
            weight = unpermute_qk(weight, heads[part])
        if blocks:
            yield hf_name, tag_blocks(weight.contiguous(), t.tensor_type)
            continue
        if dtype is not None:
            weight = weight.to(dtype)
        yield hf_name, weight.contiguous()


def _blocks(raw: object, qtype: int, shape: tuple[int, ...], name: str,
            device: torch.device | str | None) -> torch.Tensor:
    """The bytes of a quantized [N, K] tensor as uint8 [N, row_bytes] on ``device`` (a copy)."""
    data = _as_uint8(raw)
    expected = shape[0] * row_bytes(qtype, shape[1])
    if data.numel() != expected:
        raise ValueError(f"GGUF tensor {name!r}: {data.numel()} bytes for shape {list(shape)}, expected {expected}")
    return data.reshape(shape[0], -1).to(device, copy=True)
