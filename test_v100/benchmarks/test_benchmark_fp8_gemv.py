"""benchmarks/kernels/benchmark_fp8_gemv.py and the shipped qwen3-8b-fp8 config, without a GPU: the
projection shapes, the config's published size and FP8 format, the weight layout the benchmark
feeds the kernels, argument checks and the CUDA requirement."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from benchmarks import utils
from benchmarks.kernels import benchmark_fp8_gemv as bench
from benchmarks.kernels.benchmark_gemv import layer_shapes
from vllm_volta.model_executor.layers.quantization import get_quant_config


def test_qwen3_8b_fp8_config_has_the_published_shape_and_format():
    """qwen3-8b-fp8 is Qwen3-8B-FP8's config; qwen3-8b (the float16 baseline) the same but dense."""
    cfg = AutoConfig.from_pretrained(utils.resolve_model(None, "qwen3-8b-fp8"))
    quant = get_quant_config(cfg)
    assert (quant.quant_method, quant.strategy, quant.block_shape, quant.act_quant) == \
        ("fp8", "block", (128, 128), "dynamic")
    dense = copy.deepcopy(cfg)
    del dense.quantization_config
    baseline = AutoConfig.from_pretrained(utils.resolve_model(None, "qwen3-8b"))
    differ = {key for key in baseline.to_dict().keys() | dense.to_dict().keys()
              if baseline.to_dict().get(key) != dense.to_dict().get(key)}
    assert get_quant_config(baseline) is None and differ == {"_name_or_path"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(dense)
    assert sum(p.numel() for p in model.parameters()) == 8_190_735_360  # Qwen3-8B
    shapes = layer_shapes(json.loads((utils.CONFIGS_DIR / "qwen3-8b-fp8" / "config.json").read_text()))
    assert shapes == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


def test_weights_are_fp8_with_block_scale_rows():
    w, s = bench.fp8_weight(300, 400, torch.device("cpu"))
    assert w.dtype == torch.float8_e4m3fn and w.shape == (300, 400)
    assert s.dtype == torch.float32 and s.shape == (300, 4) and s.is_contiguous()
    assert torch.equal(s[:128], s[:1].expand(128, 4)) and torch.equal(s[256:], s[256:257].expand(44, 4))


def test_arguments_and_cuda_requirement(monkeypatch):
    assert bench.parse_args([]).rows == [1, 4, 8, 16, 64, 256]
    with pytest.raises(ValueError, match="--rows must be >= 1"):
        bench.parse_args(["--rows", "0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="benchmark_fp8_gemv.py needs a CUDA GPU"):
        bench.run(bench.parse_args([]))
