"""The decode roofline of quantized mixture-of-experts checkpoints: the shipped Qwen3-30B-A3B AWQ
config's routed experts count half a byte per weight plus a float16 scale and a 4-bit zero per
128, only the routed ones; FP8 experts one byte."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from benchmarks.decode_bytes import decode_bytes_per_step
from benchmarks.utils import CONFIGS_DIR, weight_bytes_per_token


def _config(name: str, **changes):
    d = json.loads((CONFIGS_DIR / name / "config.json").read_text()) | changes
    return transformers.AutoConfig.for_model(d.pop("model_type"), **d)


@pytest.mark.parametrize("batch", [1, 16])
def test_awq_experts_count_four_bits(batch):
    awq = _config("qwen3-30b-a3b-awq")
    assert awq.quantization_config["group_size"] == 128 and awq.num_experts == 128
    experts = 48 * 128 * 3 * 2048 * 768  # 48 layers of 128 experts: gate, up, down 2048 x 768
    # weight_bytes_per_token packs the attention linears; the fused expert tensors it counts at 2 bytes
    rest = weight_bytes_per_token(awq, torch.float16)["weight_bytes_per_token"] - experts * 2
    used = 128 * (1 - (1 - 8 / 128) ** batch)
    got = decode_bytes_per_step(awq, torch.float16, batch, 128, 128)["weight_bytes_per_step"]
    assert got == pytest.approx(rest + experts * used / 128 * (0.5 + 2.5 / 128))
    dense = decode_bytes_per_step(_config("qwen3-30b-a3b"), torch.float16, batch, 128, 128)["weight_bytes_per_step"]
    assert got < dense / 2.5  # the experts dominate: close to a quarter of the float16 bytes


def test_fp8_experts_count_one_byte():
    fp8 = _config("qwen3-30b-a3b", quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                                                         "weight_block_size": [128, 128]})
    experts = 48 * 128 * 3 * 2048 * 768
    rest = weight_bytes_per_token(fp8, torch.float16)["weight_bytes_per_token"] - experts * 2
    used = 128 * (1 - (1 - 8 / 128) ** 1)
    got = decode_bytes_per_step(fp8, torch.float16, 1, 128, 1)["weight_bytes_per_step"]
    assert got == pytest.approx(rest + experts * used / 128)
