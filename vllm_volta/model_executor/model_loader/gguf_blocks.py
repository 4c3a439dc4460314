"""GGUF weights handed to the model still in their blocks.

A quantized GGUF tensor of torch shape [N, K] is N rows of K / block_elems blocks, each row a run
of whole blocks (gguf_dequant.py documents the block layouts). Kept as a uint8 tensor
[N, row_bytes], its rows slice like any weight's rows (tensor-parallel output shards, fused
q/k/v parts), and a row's blocks slice on block boundaries (row-parallel K shards).

``iterate_gguf_weights`` yields such tensors for the linear layers' weights of the types the CUDA
kernels read (``KEPT_TYPES``), tagged with their GGML type (``block_qtype``); the GGUF linear
method (layers/quantization/gguf.py) keeps them or dequantizes them.
"""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["KEPT_TYPES", "block_qtype", "block_size", "row_bytes", "tag_blocks"]

# The types gguf_gemv / gguf_dequantize (csrc/gguf_kernels.cu) read: Q4_K_M / Q5_K_M / Q6_K /
# Q8_0 / Q4_0 files hold their linear weights in these.
KEPT_TYPES: frozenset[GGMLQuantizationType] = frozenset({
    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
})
_ATTR = "gguf_qtype"


def block_size(qtype: GGMLQuantizationType | int) -> tuple[int, int]:
    """(weights, bytes) of one block of ``qtype``."""
    return GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype))]


def row_bytes(qtype: GGMLQuantizationType | int, k: int) -> int:
    """Bytes of one row of ``k`` weights (``k`` a multiple of the block size)."""
    elems, nbytes = block_size(qtype)
    return k // elems * nbytes


def tag_blocks(blocks: torch.Tensor, qtype: GGMLQuantizationType | int) -> torch.Tensor:
    """Mark a uint8 [N, row_bytes] tensor as GGUF blocks of ``qtype`` (an attribute on the tensor:
    the model's weight loaders pass checkpoint tensors through untouched)."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise ValueError(f"GGUF blocks must be a 2-D uint8 tensor, got {blocks.dtype} {tuple(blocks.shape)}")
    setattr(blocks, _ATTR, GGMLQuantizationType(int(qtype)))
    return blocks


def block_qtype(tensor: torch.Tensor) -> GGMLQuantizationType | None:
    """The GGML type of a tensor made by ``tag_blocks``; None for a plain (dense) tensor."""
    return getattr(tensor, _ATTR, None)
