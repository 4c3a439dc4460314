"""Shared cases of the GGUF kernel tests: random blocks of each kept type, and float64 references
from the PyTorch dequantizer (model_loader/gguf_dequant.py)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from test_v100.model_executor.layers.quantization.gguf_checkpoints import random_blocks
from vllm_volta.model_executor.model_loader.gguf_dequant import dequantize

TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
# K per type: the 32-weight types also at K = 288 (9 blocks: the last 256-weight step is partial).
K_VALUES = {T.Q4_0: (288, 4096), T.Q8_0: (288, 4096), T.Q4_K: (256, 4096), T.Q5_K: (768, 4096),
            T.Q6_K: (512, 4096)}


def blocks(qtype: T, n: int, k: int, seed: int) -> torch.Tensor:
    """uint8 [n, row_bytes] of random ``qtype`` blocks, weights of about 0.05."""
    return torch.from_numpy(random_blocks(qtype, n, k, np.random.default_rng(seed), scale=0.05))


def weight64(w: torch.Tensor, qtype: T, k: int) -> torch.Tensor:
    """The dequantized weight [n, k] in float64 (exact: the dequantizer's float32 values)."""
    return dequantize(w.cpu(), qtype, (w.shape[0], k)).double()


def reference(x: torch.Tensor, w: torch.Tensor, qtype: T, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T (+ bias) in float64 on the CPU."""
    out = x.cpu().double() @ weight64(w, qtype, x.shape[-1]).T
    return out if bias is None else out + bias.cpu().double()


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor) -> None:
    """FP32 accumulation rounded once to float16: within a few float16 ulps of the largest output."""
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=2e-3 * float(ref.abs().max()))
