"""GPTQ 4-bit checkpoints, repacked to AWQ's layout as they load: the repacking against the
published formats, and whole models against transformers running the same weights dense."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models import hf_compare
from test_v100.model_executor.models.hf_compare import TINY, load_ours, save_random_hf_model
from vllm_volta.model_executor.layers.quantization import get_quant_config
from vllm_volta.model_executor.layers.quantization.awq import AWQConfig, dequantize_torch
from vllm_volta.model_executor.layers.quantization.gptq import gptq_tensor_to_awq

from .checkpoints import pack_natural, quantize_hf_model, random_quantized


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_repacked_tensors_give_the_weight(fmt):
    gen = torch.Generator().manual_seed(3)
    q, z, s, w = random_quantized(64, 40, 16, gen)
    assert (z == 0).any()  # v1 stores zero 0 as 15 (zero - 1 mod 16)
    stored = (z - 1) & 0xF if fmt == "gptq" else z
    qweight = gptq_tensor_to_awq("qweight", pack_natural(q, 0), fmt)
    qzeros = gptq_tensor_to_awq("qzeros", pack_natural(stored, 1), fmt)
    got = dequantize_torch(qweight, qzeros, gptq_tensor_to_awq("scales", s, fmt), 16, torch.float32)
    torch.testing.assert_close(got.double(), w, atol=0, rtol=0)


def test_config():
    cfg = transformers.LlamaConfig(**TINY)
    cfg.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}
    assert get_quant_config(cfg) == AWQConfig(32, source="gptq")
    for other, layout in (({"desc_act": True}, "rows"), ({"bits": 8}, "rows"), ({"group_size": -1}, "awq")):
        cfg.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 32} | other
        assert get_quant_config(cfg).layout == layout  # packed_int.py (test_gptq_packed.py)
    for bad, match in (({"bits": 3}, "bits: GPTQ with 3 bits"), ({"group_size": 0}, "group_size must be"),
                       ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'")):
        cfg.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 32} | bad
        with pytest.raises(ValueError, match=match):
            get_quant_config(cfg)


@pytest.fixture(scope="module", params=["gptq", "gptq_v2"])
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_random_hf_model(transformers.Qwen2Config(**TINY), folder / "dense")  # q/k/v biases too
    quantize_hf_model(hf, folder, group=32, fmt=request.param)
    return hf, load_ours(folder)


def test_loaded_in_awq_layout(models):
    _, ours = models
    qkv = ours.model.layers[0].self_attn.qkv_proj
    assert qkv.qweight.shape == (64, (64 + 2 * 32) // 8) and "GPTQ" in qkv.quant_method.config.describe()

