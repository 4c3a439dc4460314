"""AWQ checkpoints for tests, written from the published format (not from vllm_volta's code):
per linear layer qweight int32 [K, N/8] with column ORDER[i] of each 8 in bits 4i..4i+3, qzeros
int32 [K/g, N/8] packed alike, scales [K/g, N]; W[k, n] = (q[k, n] - z[k/g, n]) * s[k/g, n]."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack(values: torch.Tensor) -> torch.Tensor:
    """int [R, C] in 0..15 -> int32 [R, C / 8] in AWQ's nibble order."""
    rows, cols = values.shape
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for j in range(cols // 8):
        for i in range(8):
            packed[:, j] |= values[:, 8 * j + ORDER[i]].long() << (4 * i)
    return (packed - (packed >= 2**31).long() * 2**32).to(torch.int32)  # as two's complement int32


def random_quantized(k: int, n: int, group: int, gen: torch.Generator):
    """(q [K, N], z [K/g, N], s [K/g, N] float16 values, W [K, N] float64)."""
    q = torch.randint(0, 16, (k, n), generator=gen)
    z = torch.randint(0, 16, (k // group, n), generator=gen)
    s = (torch.rand(k // group, n, generator=gen) * 0.04 + 0.01).half()
    w = (q - z.repeat_interleave(group, 0)).double() * s.double().repeat_interleave(group, 0)
    return q, z, s, w


def quantize_hf_model(hf: torch.nn.Module, folder: Path, group: int, seed: int = 0) -> None:
    """Give every linear layer of ``hf``'s decoder random 4-bit weights (its dense weight set to
    their exact value, float32) and save it to ``folder`` as an AWQ checkpoint."""
    gen = torch.Generator().manual_seed(seed)
    packed: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in hf.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in name:
                n, k = module.weight.shape
                q, z, s, w = random_quantized(k, n, group, gen)
                module.weight.copy_(w.t())
                packed |= {f"{name}.qweight": pack(q), f"{name}.qzeros": pack(z), f"{name}.scales": s}
    hf.save_pretrained(folder, safe_serialization=True)
    tensors = {k: v for k, v in load_file(folder / "model.safetensors").items()
               if not (k.endswith(".weight") and k[: -len(".weight")] + ".qweight" in packed)}
    save_file(tensors | packed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group,
                                     "version": "gemm", "zero_point": True}
    (folder / "config.json").write_text(json.dumps(config))
