"""GPTQ and compressed-tensors checkpoints for tests: float weights quantized here (round to
nearest, min / max or abs-max scales), packed as each format is published, saved with the HF
model's config.json. Written from the formats, not from vllm_volta's code.

- GPTQ (b bits, p = 32 / b): qweight int32 [K/p, N], input row p*i + j in bits b*j; qzeros int32
  [G, N/p] packed along N alike, holding zero - 1 (mod 2**b) in format "gptq", the zero in
  "gptq_v2"; scales [G, N]; g_idx [K].
- compressed-tensors "pack-quantized": values stored unsigned (signed + 2**(b-1));
  weight_packed int32 [N, K/p] packed along K, weight_zero_point int32 [N/p, G] packed along N,
  weight_scale [N, G], weight_shape (N, K), weight_g_idx [K] for actorder "group".
W[n, k] = (q[n, k] - zero[n, G(k)]) * scale[n, G(k)] with G(k) = g_idx[k].
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from test_v100.model_executor.models.hf_compare import TINY
from vllm_volta.model_executor.layers.quantization import get_quant_config


@dataclass
class Quantized:
    q: torch.Tensor  # [N, K] unsigned values
    zeros: torch.Tensor  # [G, N] unsigned zero points
    scales: torch.Tensor  # [G, N] float16
    g_idx: torch.Tensor  # [K] int32
    dense: torch.Tensor  # [N, K] float64, the value the checkpoint stands for


def quantize(w: torch.Tensor, bits: int, group: int, sym: bool, act_order: bool, gen: torch.Generator) -> Quantized:
    """Quantize W [N, K] (HF Linear layout) per output row and group of inputs. ``group`` -1: one
    group per row. With ``act_order`` the inputs are visited in an order drawn from ``gen`` (GPTQ
    uses the Hessian's, the same for layers that share an input) and each run of ``group`` of
    them in that order is one group."""
    n, k = w.shape
    group = k if group == -1 else group
    order = torch.randperm(k, generator=gen) if act_order else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    num_groups, top = -(-k // group), (1 << bits) - 1  # in activation order the last may be short
    w = w.double()
    q = torch.empty(n, k, dtype=torch.long)
    zeros = torch.empty(num_groups, n, dtype=torch.long)
    scales = torch.empty(num_groups, n, dtype=torch.float16)
    for j in range(num_groups):
        cols = (g_idx == j).nonzero().flatten()
        part = w[:, cols]
        if sym:
            s = (part.abs().amax(1) / ((top + 1) // 2 - 1)).clamp_min(1e-6)
            z = torch.full((n,), (top + 1) // 2, dtype=torch.long)
        else:
            lo, hi = part.amin(1).clamp(max=0), part.amax(1).clamp(min=0)
            s = ((hi - lo) / top).clamp_min(1e-6)
            z = torch.round(-lo / s).long().clamp(0, top)
        s = s.half().double()
        q[:, cols] = (torch.round(part / s[:, None]).long() + z[:, None]).clamp(0, top)
        zeros[j], scales[j] = z, s.half()
    dense = (q - zeros.t()[:, g_idx.long()]).double() * scales.t().double()[:, g_idx.long()]
    return Quantized(q, zeros, scales, g_idx, dense)


def pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned b-bit values [R, C] -> int32, 32/b consecutive values along ``dim`` per int32,
    value j of each run in bits b*j."""
    per = 32 // bits
    v = values.long().movedim(dim, 0)
    v = v.reshape(v.shape[0] // per, per, *v.shape[1:])
    words = sum(v[:, j] << (bits * j) for j in range(per))
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(0, dim).contiguous()


def gptq_tensors(qt: Quantized, bits: int, fmt: str) -> dict[str, torch.Tensor]:
    stored = (qt.zeros - 1) & ((1 << bits) - 1) if fmt == "gptq" else qt.zeros
    return {"qweight": pack(qt.q.t(), bits, 0), "qzeros": pack(stored, bits, 1), "scales": qt.scales,
            "g_idx": qt.g_idx}


def ct_tensors(qt: Quantized, bits: int, sym: bool, act_order: bool) -> dict[str, torch.Tensor]:
    out = {"weight_packed": pack(qt.q, bits, 1), "weight_scale": qt.scales.t().contiguous(),
           "weight_shape": torch.tensor(list(qt.q.shape))}
    if not sym:
        out["weight_zero_point"] = pack(qt.zeros.t(), bits, 0)
    if act_order:
        out["weight_g_idx"] = qt.g_idx
    return out


@dataclass
class Scheme:
    """One checkpoint format: ``method`` "gptq" (``fmt`` gptq / gptq_v2) or "compressed-tensors"."""
    method: str
    bits: int = 4
    group: int = 32
    sym: bool = False
    act_order: bool = False
    fmt: str = "gptq"
    ignore: tuple[str, ...] = ()

    def config(self) -> dict:
        if self.method == "gptq":
            return {"quant_method": "gptq", "bits": self.bits, "group_size": self.group, "desc_act": self.act_order,
                    "sym": self.sym, "checkpoint_format": self.fmt}
        weights = {"num_bits": self.bits, "type": "int", "symmetric": self.sym, "dynamic": False,
                   "strategy": "channel" if self.group == -1 else "group",
                   "group_size": None if self.group == -1 else self.group,
                   "actorder": "group" if self.act_order else None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                              "output_activations": None}},
                "ignore": ["lm_head", *self.ignore], "kv_cache_scheme": None}

    def tensors(self, qt: Quantized) -> dict[str, torch.Tensor]:
        if self.method == "gptq":
            return gptq_tensors(qt, self.bits, self.fmt)
        return ct_tensors(qt, self.bits, self.sym, self.act_order)

    def ignored(self, module: str) -> bool:
        return any(re.fullmatch(e[3:], module) if e.startswith("re:") else e == module for e in self.ignore)


def quantize_hf_model(hf: torch.nn.Module, folder: Path, scheme: Scheme, seed: int = 0) -> None:
    """Quantize every linear layer of ``hf``'s decoder (but ``scheme.ignore``'s) in ``scheme``,
    set its dense weight to the dequantized value, and save ``hf`` to ``folder`` in that format."""
    packed: dict[str, torch.Tensor] = {}
    inputs: dict[str, int] = {}  # one activation order per input: q/k/v share one, gate/up one
    with torch.no_grad():
        for name, module in hf.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in name and not scheme.ignored(name):
                shared_input = re.sub(r"\.(q|k|v)_proj$", ".qkv", re.sub(r"\.(gate|up)_proj$", ".gate_up", name))
                order = torch.Generator().manual_seed(seed + inputs.setdefault(shared_input, len(inputs)))
                qt = quantize(module.weight, scheme.bits, scheme.group, scheme.sym, scheme.act_order, order)
                module.weight.copy_(qt.dense)
                packed |= {f"{name}.{key}": t for key, t in scheme.tensors(qt).items()}
    hf.save_pretrained(folder, safe_serialization=True)
    replaced = {key.rsplit(".", 1)[0] for key in packed}
    tensors = {k: v for k, v in load_file(folder / "model.safetensors").items()
               if not (k.endswith(".weight") and k[: -len(".weight")] in replaced)}
    save_file(tensors | packed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = scheme.config()
    (folder / "config.json").write_text(json.dumps(config))


def config_of(scheme: Scheme):
    """The quantization config our loader makes of ``scheme``'s checkpoint."""
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = scheme.config()
    return get_quant_config(cfg)

