"""FP8 checkpoints for tests: float weights quantized here block by block (scale = amax / 448,
q = round-to-nearest float8_e4m3fn of w / scale), saved as each format is published. Written from
the formats, not from vllm_volta's code.

- ``fp8`` block (DeepSeek / Qwen3 -FP8): ``weight`` fp8 [N, K], ``weight_scale_inv``
  [ceil(N / bn), ceil(K / bk)], W = q * scale of its block; ``weight_block_size`` [bn, bk].
- ``fp8`` per tensor (AutoFP8): ``weight_scale`` (a scalar), static ``input_scale``.
- compressed-tensors float (``float-quantized``): ``weight_scale`` [1] (tensor), [N, 1] (channel)
  or [ceil(N / bn), ceil(K / bk)] (block, ``block_structure``), static ``input_scale`` [1].
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from test_v100.model_executor.models.hf_compare import TINY
from vllm_volta.model_executor.layers.quantization import get_quant_config

FP8 = torch.float8_e4m3fn


@dataclass
class QuantizedFp8:
    q: torch.Tensor  # [N, K] float8_e4m3fn
    scale: torch.Tensor  # the checkpoint's scale tensor, in the scheme's scale dtype
    dense: torch.Tensor  # [N, K] float64: q * scale, what the checkpoint stands for


@dataclass
class Fp8Scheme:
    """One FP8 checkpoint format: ``method`` "fp8" or "compressed-tensors"; ``strategy`` block /
    channel / tensor; ``acts`` "dynamic", "static" or None (weight-only, compressed-tensors)."""
    method: str = "fp8"
    strategy: str = "block"
    block: tuple[int, int] = (128, 128)
    acts: str | None = "dynamic"
    scale_dtype: torch.dtype = torch.float32
    ignore: tuple[str, ...] = ()
    ignore_key: str = "ignored_layers"  # fp8: or "modules_to_not_convert"
    extra: dict = field(default_factory=dict)

    @property
    def scale_name(self) -> str:
        return "weight_scale_inv" if self.method == "fp8" and self.strategy == "block" else "weight_scale"

    def config(self) -> dict:
        if self.method == "fp8":
            qc = {"quant_method": "fp8", "activation_scheme": self.acts, "fmt": "e4m3"}
            if self.strategy == "block":
                qc["weight_block_size"] = list(self.block)
            if self.ignore:
                qc[self.ignore_key] = list(self.ignore)
            return qc | self.extra
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": self.strategy,
                   "group_size": None, "block_structure": list(self.block) if self.strategy == "block" else None}
        acts = None
        if self.acts == "dynamic":
            acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True,
                    "strategy": "group" if self.strategy == "block" else "token",
                    "group_size": self.block[1] if self.strategy == "block" else None}
        elif self.acts == "static":
            acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}
        return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                              "output_activations": None}},
                "ignore": ["lm_head", *self.ignore], "kv_cache_scheme": None} | self.extra

    def quantize(self, w: torch.Tensor) -> QuantizedFp8:
        """w [N, K] -> fp8 values and the scales of this strategy (stored in ``scale_dtype``)."""
        n, k = w.shape
        bn, bk = self.block if self.strategy == "block" else ((1, k) if self.strategy == "channel" else (n, k))
        rows, cols = -(-n // bn), -(-k // bk)
        w = w.double()
        scale = torch.empty(rows, cols, dtype=torch.float64)
        q = torch.empty(n, k, dtype=FP8)
        dense = torch.empty(n, k, dtype=torch.float64)
        for i in range(rows):
            for j in range(cols):
                part = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
                s = (part.abs().max().clamp_min(1e-12) / 448.0).to(self.scale_dtype).double()
                qb = (part / s).clamp(-448, 448).to(FP8)
                scale[i, j] = s
                q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = qb
                dense[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = qb.double() * s
        if self.strategy == "tensor":
            scale = scale.reshape(()) if self.method == "fp8" else scale.reshape(1)
        return QuantizedFp8(q, scale.to(self.scale_dtype), dense)

    def tensors(self, qt: QuantizedFp8, input_scale: float = 0.05) -> dict[str, torch.Tensor]:
        out = {"weight": qt.q, self.scale_name: qt.scale}
        if self.acts == "static":
            out["input_scale"] = torch.tensor(input_scale if self.method == "fp8" else [input_scale])
        return out

    def ignored(self, module: str) -> bool:
        return any(re.fullmatch(e[3:], module) if e.startswith("re:") else e == module for e in self.ignore)


def quantize_hf_model(hf: torch.nn.Module, folder: Path, scheme: Fp8Scheme) -> None:
    """Quantize every linear layer of ``hf``'s decoder (but ``scheme.ignore``'s) to FP8, set its
    float weight to the dequantized value, and save ``hf`` to ``folder`` in ``scheme``'s format."""
    quantized: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for i, (name, module) in enumerate(hf.named_modules()):
            if isinstance(module, torch.nn.Linear) and ".layers." in name and not scheme.ignored(name):
                qt = scheme.quantize(module.weight)
                module.weight.copy_(qt.dense)
                quantized |= {f"{name}.{key}": t for key, t in scheme.tensors(qt, 0.01 * (1 + i % 5)).items()}
    hf.save_pretrained(folder, safe_serialization=True)
    tensors = load_file(folder / "model.safetensors") | quantized
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = scheme.config()
    (folder / "config.json").write_text(json.dumps(config))


def config_of(scheme: Fp8Scheme):
    """The quantization config our loader makes of ``scheme``'s checkpoint."""
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = scheme.config()
    return get_quant_config(cfg)
