"""Dequantize GGUF tensors into torch tensors with vectorized torch ops.

Each quantized GGUF tensor is a flat run of fixed-size blocks (``gguf.GGML_QUANT_SIZES`` gives
``(elements per block, bytes per block)``). Every block here is decoded for all blocks at once
with integer bit ops on a ``[num_blocks, bytes_per_block]`` uint8 view, then scaled in float32,
so loading a model costs a few passes over its bytes instead of a Python loop per block.

Block layouts (little-endian, ``f16`` = IEEE half):
  Q8_0  d:f16, q:int8[32]                                 y = d*q
  Q4_0  d:f16, qs:u8[16]                                  y = d*(nibble-8)
  Q4_1  d:f16, m:f16, qs:u8[16]                           y = d*nibble + m
  Q5_0  d:f16, qh:u8[4], qs:u8[16]                        y = d*((nibble|hbit<<4)-16)
  Q5_1  d:f16, m:f16, qh:u8[4], qs:u8[16]                 y = d*(nibble|hbit<<4) + m
  Q2_K  scales:u8[16], qs:u8[64], d:f16, dmin:f16          16 sub-blocks of 16, 2-bit q
  Q3_K  hmask:u8[32], qs:u8[64], scales:u8[12], d:f16      16 sub-blocks of 16, 3-bit q
  Q4_K  d:f16, dmin:f16, scales:u8[12], qs:u8[128]         8 sub-blocks of 32, 6-bit scale/min
  Q5_K  d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128]
  Q6_K  ql:u8[128], qh:u8[64], scales:int8[16], d:f16      16 sub-blocks of 16, 6-bit q
In the 32-element formats the low nibbles of ``qs`` are elements 0..15 and the high nibbles
16..31; the high bit of element j is bit j of ``qh`` read as a little-endian uint32.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Decoder = Callable[[torch.Tensor], torch.Tensor]

_FLOAT_TYPES: dict[GGMLQuantizationType, torch.dtype] = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The half-precision scalar at byte ``offset`` of every block, as float32 ``[n, 1]``."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _shifts(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Split bytes ``[..., k]`` into ``[..., 2, k]``: low nibbles first, then high nibbles."""
    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of little-endian uint32 bytes ``[n, 4]`` as ``[n, 32]`` (bit j at index j)."""
    bits = (qh.unsqueeze(-1) >> _shifts(range(8), qh.device)) & 1
    return bits.reshape(qh.shape[0], 32)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).float()


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:18]).reshape(-1, 32).float()
    return _f16(b, 0) * (q - 8.0)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:20]).reshape(-1, 32).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 6:22]).reshape(-1, 32) | (_bits32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.float() - 16.0)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:24]).reshape(-1, 32) | (_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 0:16]
    # Two halves of 128 elements, each reading 32 bytes of qs four times at shifts 0,2,4,6;
    # that order (half, shift, 16-element group) is exactly the order of the 16 scale bytes.
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    q = (qs >> _shifts([0, 2, 4, 6], b.device).view(1, 1, 4, 1)) & 3
    q = q.reshape(n, 16, 16).float()
    d = _f16(b, 80).unsqueeze(-1) * (scales & 0x0F).float().unsqueeze(-1)
    m = _f16(b, 82).unsqueeze(-1) * (scales >> 4).float().unsqueeze(-1)
    return (d * q - m).reshape(n, 256)


def _q3_k_scales(s: torch.Tensor) -> torch.Tensor:
    """Unpack the 16 signed 6-bit scales of Q3_K from their 12 packed bytes: ``[n, 16]``.

    Scale i takes its low 4 bits from byte i % 8 (low nibble for i < 8, high nibble after) and
    its high 2 bits from byte 8 + i % 4 at bit offset 2 * (i // 4); it is stored offset by 32.
    """
    low = torch.cat([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], dim=1)
    high = (s[:, 8:12].unsqueeze(1) >> _shifts([0, 2, 4, 6], s.device).view(1, 4, 1)) & 3
    return (low | (high.reshape(-1, 16) << 4)).float() - 32.0


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, 0:32].reshape(n, 1, 1, 32)
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    # Element (half h, shift j, l): low 2 bits of qs[h, l] >> 2j; the "high" bit is bit 4h+j
    # of hmask[l] and, when clear, subtracts 4 (values span -4..3).
    low = (qs >> _shifts([0, 2, 4, 6], b.device).view(1, 1, 4, 1)) & 3
    hbit = (hmask >> _shifts(range(8), b.device).view(1, 2, 4, 1)) & 1
    q = low.float() - 4.0 * (1 - hbit).float()
    scales = _q3_k_scales(b[:, 96:108])
    d = _f16(b, 108).unsqueeze(-1) * scales.unsqueeze(-1)
    return (d * q.reshape(n, 16, 16)).reshape(n, 256)


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 8 six-bit (scale, min) pairs of Q4_K/Q5_K from 12 bytes: two ``[n, 8]``.

    Pairs 0..3 are the low 6 bits of bytes 0..3 / 4..7; pairs 4..7 take their low 4 bits from
    bytes 8..11 (scale: low nibble, min: high nibble) and their top 2 bits from the top 2 bits
    of bytes 0..3 / 4..7.
    """
    s0, s1, s2 = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scale = torch.cat([s0 & 63, (s2 & 0x0F) | ((s0 >> 6) << 4)], dim=1)
    minimum = torch.cat([s1 & 63, (s2 >> 4) | ((s1 >> 6) << 4)], dim=1)
    return scale.float(), minimum.float()


def _k_affine(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """y = d*scale*q - dmin*min for Q4_K/Q5_K with ``q`` shaped ``[n, 8, 32]``."""
    scale, minimum = _k_scale_min(b[:, 4:16])
    d = (_f16(b, 0) * scale).unsqueeze(-1)
    m = (_f16(b, 2) * minimum).unsqueeze(-1)
    return (d * q.float() - m).reshape(b.shape[0], 256)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    # 4 chunks of 32 bytes; a chunk's low nibbles are sub-block 2c, its high nibbles 2c+1.
    q = _nibbles(b[:, 16:144].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    return _k_affine(b, q)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    low = _nibbles(b[:, 48:176].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    # The fifth bit of sub-block k, element l, is bit k of qh[l].
    high = (b[:, 16:48].unsqueeze(1) >> _shifts(range(8), b.device).view(1, 8, 1)) & 1
    return _k_affine(b, low | (high << 4))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    # Per half of 128: four runs of 32 = low nibbles of ql[0:32], of ql[32:64], then the high
    # nibbles of each; run r takes its top 2 bits from bits 2r, 2r+1 of qh[0:32].
    low = torch.stack(
        [ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], dim=2
    )
    high = (qh >> _shifts([0, 2, 4, 6], b.device).view(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).float() - 32.0
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b, 208).unsqueeze(-1) * scales.unsqueeze(-1)
    return (d * q.reshape(n, 16, 16)).reshape(n, 256)


_DECODERS: dict[GGMLQuantizationType, Decoder] = {
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q5_1: _q5_1,
    GGMLQuantizationType.Q2_K: _q2_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}

SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(_FLOAT_TYPES) | frozenset(_DECODERS)


def _as_uint8(raw: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A flat uint8 view of ``raw`` without copying (GGUF data is a read-only memmap)."""
    if isinstance(raw, np.ndarray):
        flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        with warnings.catch_warnings():
            # Read-only memmaps are only ever read here; results live in new memory.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(flat)
    return raw.contiguous().reshape(-1).view(torch.uint8)


def dequantize(
    raw: torch.Tensor | np.ndarray,
    qtype: GGMLQuantizationType | int,
    shape: Sequence[int],
    *,
    name: str = "tensor",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Decode the bytes of one GGUF tensor into a torch tensor of ``shape``.

    ``raw`` holds the tensor's bytes (any dtype; it is reinterpreted as uint8) on any device;
    with ``device`` they are copied there and decoded there. ``shape`` is in torch order
    (slowest dimension first, i.e. GGUF's ``ne`` reversed). F32/F16/BF16 come back in their
    stored dtype, quantized types as float32; the result never aliases ``raw``. Unsupported
    types and malformed sizes raise ValueError naming the tensor.
    """
    try:
        qtype = GGMLQuantizationType(int(qtype))
    except ValueError:
        raise ValueError(f"GGUF tensor {name!r}: unknown GGML type id {qtype}") from None
    if qtype not in SUPPORTED_TYPES:
        allowed = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise ValueError(
            f"GGUF tensor {name!r} has type {qtype.name}, which is not supported; "
            f"supported types: {allowed}"
        )
    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape)) if shape else 1
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if shape and shape[-1] % block_elems:
        raise ValueError(
            f"GGUF tensor {name!r}: innermost dimension {shape[-1]} is not a multiple of the "
            f"{qtype.name} block size {block_elems}"
        )
    data = _as_uint8(raw)
    if device is not None:
        data = data.to(device)
    expected = numel // block_elems * block_bytes
    if data.numel() != expected:
        raise ValueError(
            f"GGUF tensor {name!r}: {data.numel()} bytes for {qtype.name} shape {list(shape)}, "
            f"expected {expected}"
        )
    if qtype in _FLOAT_TYPES:
        return data.view(_FLOAT_TYPES[qtype]).reshape(shape).clone()
    blocks = data.view(-1, block_bytes)
    return _DECODERS[qtype](blocks).reshape(shape)
