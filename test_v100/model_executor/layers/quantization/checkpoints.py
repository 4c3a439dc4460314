"""AWQ and GPTQ checkpoints for tests, written from the published formats (not from vllm_volta's
code); W[k, n] = (q[k, n] - z[k/g, n]) * s[k/g, n] in both, scales [K/g, N].
- AWQ: qweight int32 [K, N/8] with column ORDER[i] of each 8 in bits 4i..4i+3, qzeros int32
  [K/g, N/8] packed alike.
- GPTQ: qweight int32 [K/8, N] with row 8i+j in bits 4j; qzeros int32 [K/g, N/8] with column 8c+j
  in bits 4j, holding z - 1 (mod 16) in format "gptq", z in "gptq_v2"; g_idx [K] = k // g."""

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


def pack_natural(values: torch.Tensor, dim: int) -> torch.Tensor:
    """int [R, C] in 0..15 -> int32 packed along ``dim``: value 8i + j of that dim in bits 4j."""
    v = values.long().movedim(dim, 0)
    v = v.reshape(v.shape[0] // 8, 8, *v.shape[1:])
    packed = sum(v[:, j] << (4 * j) for j in range(8))
    packed = (packed - (packed >= 2**31).long() * 2**32).to(torch.int32)
    return packed.movedim(0, dim)


def random_quantized(k: int, n: int, group: int, gen: torch.Generator):
    """(q [K, N], z [K/g, N], s [K/g, N] float16 values, W [K, N] float64)."""
    q = torch.randint(0, 16, (k, n), generator=gen)
    z = torch.randint(0, 16, (k // group, n), generator=gen)
    s = (torch.rand(k // group, n, generator=gen) * 0.04 + 0.01).half()
    w = (q - z.repeat_interleave(group, 0)).double() * s.double().repeat_interleave(group, 0)
    return q, z, s, w


def _tensors(fmt: str, q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    if fmt == "awq":
        return {"qweight": pack(q), "qzeros": pack(z), "scales": s}
    stored = (z - 1) & 0xF if fmt == "gptq" else z
    return {"qweight": pack_natural(q, 0), "qzeros": pack_natural(stored, 1), "scales": s,
            "g_idx": (torch.arange(q.shape[0]) // group).to(torch.int32)}


def quantize_hf_model(hf: torch.nn.Module, folder: Path, group: int, seed: int = 0, fmt: str = "awq") -> None:
    """Give every linear layer of ``hf``'s decoder random 4-bit weights (its dense weight set to
    their exact value, float32) and save it to ``folder`` as an AWQ (``fmt`` "awq") or GPTQ
    ("gptq", "gptq_v2") checkpoint."""
    gen = torch.Generator().manual_seed(seed)
    packed: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in hf.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in name:
                n, k = module.weight.shape
                q, z, s, w = random_quantized(k, n, group, gen)
                module.weight.copy_(w.t())
                packed |= {f"{name}.{key}": t for key, t in _tensors(fmt, q, z, s, group).items()}
    hf.save_pretrained(folder, safe_serialization=True)
    tensors = {k: v for k, v in load_file(folder / "model.safetensors").items()
               if not (k.endswith(".weight") and k[: -len(".weight")] + ".qweight" in packed)}
    save_file(tensors | packed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = (
        {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
        if fmt == "awq" else {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False,
                              "sym": False, "checkpoint_format": fmt})
    (folder / "config.json").write_text(json.dumps(config))


def check_engine_greedy(folder: Path, hf: torch.nn.Module, method: str) -> None:
    """The engine on the quantized checkpoint in ``folder`` (float32 on the CPU, chunked prefill
    next to decodes, ``--quantization method`` checked) generates ``hf``'s greedy tokens."""
    from test_v100.worker.tiny_models import hf_greedy, random_prompts
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    llm = LLM(str(folder), skip_tokenizer_init=True, dtype="float32", cpu_kvcache_space=0.01,
              max_num_batched_tokens=16, quantization=method)
    prompts = random_prompts(3, 5, 40, seed=2)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 8)

