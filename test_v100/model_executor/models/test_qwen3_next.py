"""Qwen3-Next (Gated DeltaNet with packed in_proj_qkvz / in_proj_ba, gated attention, MoE with a
shared expert) vs transformers, on one rank and split over two gloo ranks."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from vllm_volta.model_executor.layers import parallel_state as ps

from . import hf_compare
from .hf_compare import TINY, check_needed, hf_and_ours

# Layer 0 linear attention with a MoE block, layer 1 full attention with a dense MLP
# (mlp_only_layers); top-2 of 4 experts, not renormalized.
CONFIG = dict(TINY, head_dim=32, linear_conv_kernel_dim=3, linear_key_head_dim=16, linear_value_head_dim=24,
              linear_num_key_heads=2, linear_num_value_heads=4, full_attention_interval=2, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=40,
              norm_topk_prob=False, mlp_only_layers=[1])

# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_and_ours(transformers.Qwen3NextConfig(**CONFIG), tmp_path_factory.mktemp("qwen3_next"))


def test_loaded_as_qwen3_next(models):
    hf, ours = models
    assert type(ours).__name__ == "Qwen3NextForCausalLM"
    assert [layer.layer_type for layer in ours.model.layers] == ["linear_attention", "full_attention"]
    assert type(ours.model.layers[0].mlp).__name__ == "SharedExpertMoE" and not ours.model.layers[0].mlp.renormalize
    assert type(ours.model.layers[1].mlp).__name__ == "LlamaMLP"
    assert ours.kv_cache_specs()[0].shapes == ((2 * 32 + 96, 2), (4, 16, 24))


def test_packed_projection_order_is_needed(models):
    """Reading in_proj_qkvz as Qwen3.5's plain [q | k | v | z] rows breaks the match: the
    per-key-head packing is really undone."""
    hf, ours = models
    layer = ours.model.layers[0].linear_attn
    packed = hf.model.layers[0].linear_attn.in_proj_qkvz.weight.detach().clone()
    assert packed.shape == layer.in_proj_qkvz.weight.shape  # one rank: the same rows, other order
    check_needed(ours, hf, [(layer.in_proj_qkvz.weight, "data", packed)])


def _tp_worker(rank: int, folder: str, init_file: str) -> None:
    import torch.distributed as dist

    from .hf_compare import check_mixed_batch, load_ours

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ps.set_tensor_parallel(rank, 2)
        model = load_ours(folder)
        attn, linear = model.model.layers[1].self_attn, model.model.layers[0].linear_attn
        assert (attn.num_heads, linear.num_k_heads, linear.num_v_heads) == (2, 1, 2)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).float().eval()
        check_mixed_batch(model, hf)
        dist.barrier()  # both ranks done communicating before either tears its group down
    finally:
        dist.destroy_process_group()
    os._exit(0)  # as test_parallel_state: skip the interpreter's teardown of gloo's threads


def test_tp2_matches_transformers(tmp_path):
    """Two gloo ranks, each with half of the attention heads, the DeltaNet's key / value heads
    (projection rows, conv channels, states) and every expert's intermediate size."""
    import torch.multiprocessing as mp

    hf_compare.save_random_hf_model(transformers.Qwen3NextConfig(**CONFIG), tmp_path / "ckpt")
    mp.spawn(_tp_worker, args=(str(tmp_path / "ckpt"), str(tmp_path / "rendezvous")), nprocs=2)


def test_foreign_weights_are_named(models):
    _, ours = models
    with pytest.raises(ValueError, match=r"model\.layers\.7\.linear_attn\.A_log"):
        ours.load_weights([("model.layers.7.linear_attn.A_log", torch.zeros(4))])
    with pytest.raises(ValueError, match=r"no module 'model\.layers\.1\.linear_attn'"):
        ours.load_weights([("model.layers.1.linear_attn.A_log", torch.zeros(4))])
    with pytest.raises(ValueError, match="one entry per expert"):
        ours.load_weights([("model.layers.0.mlp.experts.down_proj", torch.zeros(3, 64, 48))])
