"""GGUF linear layers (layers/quantization/gguf.py) on the CPU: which checkpoint tensors stay in
their GGUF blocks, the parts a layer keeps (rows, types, 16-byte aligned), and the tensor-parallel
rules (output rows on whole rows; a row-parallel layer's K on whole blocks, else dequantized at
load). Layers are given the CUDA method with the kernels assumed present; every kept part,
decoded by the PyTorch dequantizer, must equal the same rank's rows of a dense layer loaded with
the dequantized checkpoint."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from vllm_volta.model_executor.layers import linear
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
from vllm_volta.model_executor.layers.quantization import gguf as gguf_method
from vllm_volta.model_executor.model_loader.gguf_blocks import block_qtype, block_size
from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config
from vllm_volta.model_executor.model_loader.gguf_dequant import dequantize
from vllm_volta.model_executor.model_loader.gguf_loader import iterate_gguf_weights

from .gguf_checkpoints import HEAD_DIM, HEADS, HIDDEN, INTER, KV_HEADS, LAYER_TYPES, write_tiny_llama

# layer -> (checkpoint projection, shard id) in load order
PROJECTIONS = {
    "qkv_proj": [("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v")],
    "o_proj": [("self_attn.o_proj", None)],
    "gate_up_proj": [("mlp.gate_proj", 0), ("mlp.up_proj", 1)],
    "down_proj": [("mlp.down_proj", None)],
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(tensors with linear weights in blocks, all tensors dequantized) of the tiny GGUF llama."""
    path = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    blocks = dict(iterate_gguf_weights(path, use_tqdm=False, keep_quantized=True))
    dense = dict(iterate_gguf_weights(path, use_tqdm=False))
    return blocks, dense


class _KernelsPresent(gguf_method.GGUFConfig):
    """The CUDA layer method on any device (the choice it makes does not depend on the device)."""

    def get_quant_method(self) -> gguf_method.GGUFLinearMethod:
        return gguf_method.GGUFLinearMethod(self)


def _build(name: str) -> linear.LinearBase:
    if name == "qkv_proj":
        return linear.QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, params_dtype=torch.float32)
    if name == "gate_up_proj":
        return linear.MergedColumnParallelLinear(HIDDEN, [INTER, INTER], params_dtype=torch.float32)
    if name == "o_proj":
        return linear.RowParallelLinear(HEADS * HEAD_DIM, HIDDEN, params_dtype=torch.float32)
    return linear.RowParallelLinear(INTER, HIDDEN, params_dtype=torch.float32)


def _load(layer: linear.LinearBase, tensors: dict[str, torch.Tensor], index: int, name: str) -> None:
    for projection, shard in PROJECTIONS[name]:
        tensor = tensors[f"model.layers.{index}.{projection}.weight"]
        layer.weight.weight_loader(layer.weight, tensor, *(() if shard is None else (shard,)))


def test_iterator_yields_kept_linear_weights_as_blocks(checkpoint):
    blocks, dense = checkpoint
    kept = {name for name, t in blocks.items() if block_qtype(t) is not None}
    expected = {f"model.layers.{i}.{proj}.weight" for i, types in enumerate(LAYER_TYPES)
                for proj, part in zip(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"), types)
                if types[part] != T.Q5_0}
    assert kept == expected  # not the Q5_0 down_proj, the embeddings, the head or the norms
    for name in kept:
        t = blocks[name]
        assert t.dtype == torch.uint8 and t.shape[0] == dense[name].shape[0]
        # The blocks decode to the dequantized tensor, q/k rows un-permuted alike.
        elems, nbytes = block_size(block_qtype(t))
        assert torch.equal(dequantize(t, block_qtype(t), (t.shape[0], t.shape[1] // nbytes * elems)), dense[name])
    assert all(block_qtype(t) is None for t in dense.values())


def test_gguf_config_keeps_layers_quantized_only_on_cuda(tmp_path):
    config = get_quant_config(load_gguf_config(write_tiny_llama(tmp_path / "t.gguf")))
    assert isinstance(config, gguf_method.GGUFConfig)
    with torch.device("cpu"):
        assert config.get_quant_method() is None  # the CPU keeps today's dequantize-at-load
    assert "dequantized at load" in config.kernel_path(torch.device("cpu"), torch.float32)
    reason = gguf_method.kernels_reason(torch.device("cuda", 0), torch.float32)
    assert reason is not None and "float16" in reason


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_layers_keep_rank_rows_in_blocks(checkpoint, set_tp, monkeypatch, tp_size):
    blocks, dense = checkpoint
    monkeypatch.setattr(gguf_method, "kernels_reason", lambda device, dtype: None)
    for rank in range(tp_size):
        set_tp(rank, tp_size)
        config = _KernelsPresent()
        for index in range(len(LAYER_TYPES)):
            for name in PROJECTIONS:
                with quantization(config):
                    layer = _build(name)
                _load(layer, blocks, index, name)
                reference = _build(name)
                _load(reference, dense, index, name)
                _check_layer(layer, reference.weight, index, name, tp_size)
        assert config.layers == [8, 8]
        expect_dense = {"checkpoint tensors of types other than Q4_0, Q4_K, Q5_K, Q6_K, Q8_0": 1}
        if tp_size > 1:  # o_proj: 256 / tp inputs per rank are not whole 256-weight super-blocks
            assert sum(config.dense.values()) == 3 and all("row-parallel" in why for why in config.dense
                                                          if why not in expect_dense)
        else:
            assert config.dense == expect_dense


def _check_layer(layer: linear.LinearBase, reference: torch.Tensor, index: int, name: str, tp_size: int) -> None:
    types = LAYER_TYPES[index]
    parts_of = {"qkv_proj": ["attn_q", "attn_k", "attn_v"], "o_proj": ["attn_output"],
                "gate_up_proj": ["ffn_gate", "ffn_up"], "down_proj": ["ffn_down"]}[name]
    row_split_k = name == "o_proj" and tp_size > 1 and block_size(types["attn_output"])[0] == 256
    if any(types[p] == T.Q5_0 for p in parts_of) or row_split_k:
        assert layer.gguf_parts is None
        assert layer.weight.dtype == torch.float32 and torch.equal(layer.weight, reference)
        return
    parts = layer.gguf_parts
    # Consecutive projections of one type share a part, in output order.
    run_types = [types[p] for i, p in enumerate(parts_of) if i == 0 or types[p] != types[parts_of[i - 1]]]
    assert [p.qtype for p in parts] == run_types
    assert layer.weight.dtype == torch.uint8 and layer.weight.dim() == 1
    rebuilt = torch.empty_like(reference)
    for p in parts:
        assert p.blocks.data_ptr() % 16 == 0 and p.blocks.untyped_storage().data_ptr() == layer.weight.data_ptr()
        assert p.blocks.shape[1] == layer.input_size // block_size(p.qtype)[0] * block_size(p.qtype)[1]
        rebuilt[p.row0:p.row0 + p.rows] = dequantize(p.blocks, p.qtype, (p.rows, layer.input_size))
    assert sum(p.rows for p in parts) == layer.output_size
    assert torch.equal(rebuilt, reference)


def test_load_log_counts_kept_weights(checkpoint, monkeypatch):
    blocks, _ = checkpoint
    monkeypatch.setattr(gguf_method, "kernels_reason", lambda device, dtype: None)
    config = _KernelsPresent()
    logged = []
    monkeypatch.setattr(gguf_method.logger, "info", lambda msg, *args: logged.append(msg % args))
    with quantization(config):  # as a model: every layer built, then loaded
        layers = {(index, name): _build(name) for index in range(len(LAYER_TYPES)) for name in PROJECTIONS}
    for (index, name), layer in layers.items():
        _load(layer, blocks, index, name)
    # Q4_K: q, k; Q5_K: o, gate; Q6_K: v, o, up; Q4_0: gate, up; Q8_0: down, q, k, v.
    assert {t: n for t, (n, _) in config.kept.items()} == {"Q4_K": 2, "Q5_K": 2, "Q6_K": 3, "Q4_0": 2, "Q8_0": 4}
    assert config.kept["Q4_K"][1] == (HEADS + KV_HEADS) * HEAD_DIM * 144  # bytes: one super-block a row
    summary = [m for m in logged if m.startswith("GGUF Q4_0")]
    assert len(summary) == 1 and "Q4_K: 2 linear weights" in summary[0] and "1 layers dequantized" in summary[0]
    kept_bytes = sum(nbytes for _, nbytes in config.kept.values())
    assert f"({kept_bytes / 2**30:.2f} GiB, " in summary[0] and "GiB in float16)" in summary[0]
    # float16 bytes of what is kept: qkv, o and gate_up of both layers (K = HIDDEN), layer 0's down_proj
    per_layer = ((HEADS + 2 * KV_HEADS) * HEAD_DIM + HIDDEN + 2 * INTER) * HIDDEN
    assert config.float16_bytes[0] == 2 * (2 * per_layer + HIDDEN * INTER)


def test_a_layer_is_not_used_before_its_parts_arrive(checkpoint, monkeypatch):
    blocks, _ = checkpoint
    monkeypatch.setattr(gguf_method, "kernels_reason", lambda device, dtype: None)
    with quantization(_KernelsPresent()):
        layer = _build("qkv_proj")
    layer.weight.weight_loader(layer.weight, blocks["model.layers.0.self_attn.q_proj.weight"], "q")
    assert layer.gguf_parts is None  # k and v still to come
    with pytest.raises(RuntimeError, match="before all of its checkpoint tensors"):
        layer(torch.zeros(1, HIDDEN))
