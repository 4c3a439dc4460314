"""AWQ 4-bit weights: unpacking, the linear layers at every kind of sharding, and whole models
against transformers running the same weights dense."""

from __future__ import annotations

import pytest
import torch
import transformers

from test_v100.model_executor.models import hf_compare
from test_v100.model_executor.models.hf_compare import (TINY, check_engine_logprobs, load_ours,
                                                        save_random_hf_model)
from vllm_volta.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                     RowParallelLinear)
from vllm_volta.model_executor.layers.quantization import get_quant_config, quantization
from vllm_volta.model_executor.layers.quantization.awq import AWQConfig, dequantize_torch, unpack_awq

from .checkpoints import pack, quantize_hf_model, random_quantized

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


# The shared model checks, run on this module's ``models`` fixture.
test_single_prefill_matches_transformers = hf_compare.test_single_prefill_matches_transformers
test_mixed_batch_matches_transformers = hf_compare.test_mixed_batch_matches_transformers


def test_unpack_and_dequantize_match_the_format():
    gen = torch.Generator().manual_seed(0)
    q, z, s, w = random_quantized(64, 48, 16, gen)
    assert torch.equal(unpack_awq(pack(q)), q.int())
    got = dequantize_torch(pack(q), pack(z), s, 16, torch.float32)
    torch.testing.assert_close(got.double(), w, atol=0, rtol=0)


def _load(layer, tensors, shard_ids=(None,)):
    """Feed each (name, tensor[, shard id]) to the layer's parameter loaders."""
    params = dict(layer.named_parameters())
    for name, tensor, *shard in tensors:
        param = params[name]
        param.weight_loader(param, tensor, *shard)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 3, 8, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_layers_compute_x_w(device, rows, dtype):
    """Merged gate/up, fused q/k/v (loaded per shard) and a row-parallel layer with a bias: x W
    with W from the packed tensors; decode-sized inputs (<= 8 rows) and prefill-sized ones."""
    gen = torch.Generator().manual_seed(1)
    group = 32
    x = torch.randn(rows, 128, generator=gen)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    with torch.device(device), quantization(AWQConfig(group)):
        merged = MergedColumnParallelLinear(128, [64, 96], params_dtype=dtype)
        qkv = QKVParallelLinear(128, 16, 4, 2, bias=True, params_dtype=dtype)
        row = RowParallelLinear(128, 40, bias=True, params_dtype=dtype)
    assert merged.quant_method is not None and not hasattr(merged, "weight")
    for layer, parts in ((merged, [(0, 64), (1, 96)]), (qkv, [("q", 64), ("k", 32), ("v", 32)]), (row, [(None, 40)])):
        dense = []
        for shard, n in parts:
            q, z, s, w = random_quantized(128, n, group, gen)
            extra = () if shard is None else (shard,)
            _load(layer, [("qweight", pack(q), *extra), ("qzeros", pack(z), *extra), ("scales", s, *extra)])
            dense.append(w)
        w = torch.cat(dense, 1)
        bias = None
        if layer.bias is not None:
            bias = torch.randn(w.shape[1], generator=gen)
            layer.bias.data.copy_(bias)
        want = x.double() @ w + (0 if bias is None else bias.double())
        got = layer(x.to(device, dtype))
        assert got.shape == (rows, w.shape[1]) and got.dtype == dtype
        torch.testing.assert_close(got.double().cpu(), want, **tol)


def test_config_errors_name_the_field():
    cfg = transformers.LlamaConfig(**TINY)
    assert get_quant_config(cfg) is None
    cfg.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm",
                               "zero_point": True}
    assert get_quant_config(cfg) == AWQConfig(32)
    for bad, match in (({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not supported; supported: awq, gptq"),
                       ({"bits": 8}, "bits: AWQ with 8 bits"), ({"version": "gemv"}, "version: AWQ 'gemv'"),
                       ({"zero_point": False}, "zero_point"), ({"group_size": 0}, "group_size must be"),
                       ({"modules_to_not_convert": "visual"}, "modules_to_not_convert must be a list")):
        cfg.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": 32} | bad
        with pytest.raises(ValueError, match=match):
            get_quant_config(cfg)
    with quantization(AWQConfig(32)), pytest.raises(ValueError, match="multiple of the group size 32"):
        RowParallelLinear(48, 64)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"awq-{request.param}")
    config = (transformers.LlamaConfig(**TINY) if request.param == "llama"
              else transformers.Qwen2Config(**TINY))  # Qwen2: q/k/v biases beside the packed weights
    hf = save_random_hf_model(config, folder / "dense")
    quantize_hf_model(hf, folder, group=32)
    return hf, load_ours(folder)


def test_model_keeps_packed_weights(models):
    _, ours = models
    names = {n for n, _ in ours.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.qweight" in names
    assert not any(n.endswith("proj.weight") for n in names)
    assert ours.model.layers[0].mlp.gate_up_proj.qweight.dtype == torch.int32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_engine_logprobs_match_transformers(tmp_path):
    """The engine as users run an AWQ checkpoint (fp16, CUDA graphs: awq_gemv at decode,
    awq_dequantize + cuBLAS in prefill) against transformers running the same weights dense."""
    # The vocabulary of tiny_models.random_prompts (ids up to 383).
    config = transformers.LlamaConfig(**{**TINY, "hidden_size": 256, "intermediate_size": 512,
                                         "num_attention_heads": 4, "num_key_value_heads": 2,
                                         "vocab_size": 384})
    hf = save_random_hf_model(config, tmp_path / "dense")
    with torch.no_grad():  # weights of a trained model's size, so fp16 noise stays small
        for p in hf.parameters():
            p.mul_(0.3)
    quantize_hf_model(hf, tmp_path, group=64)
    check_engine_logprobs(tmp_path, hf)


def test_engine_greedy_matches_transformers(tmp_path):
    """The engine (float32 on the CPU here, chunked prefill next to decodes) on an AWQ checkpoint
    generates transformers' greedy tokens of the same weights dense."""
    from test_v100.worker.tiny_models import hf_greedy, random_prompts
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    hf = save_random_hf_model(transformers.Qwen2Config(**{**TINY, "vocab_size": 384}), tmp_path / "dense")
    quantize_hf_model(hf, tmp_path, group=32)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", cpu_kvcache_space=0.01,
              max_num_batched_tokens=16)
    prompts = random_prompts(3, 5, 40, seed=2)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 8)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_tp2_shards_reassemble(set_tp, kv_heads):
    """At tp_size 2 each rank holds its slice of the packed tensors (columns of 8 outputs, rows
    of whole groups); the slices rebuild x W of the full layers (a single kv head replicated)."""
    gen = torch.Generator().manual_seed(4)
    group, hidden, d, heads = 32, 128, 16, 4
    x, xi = torch.randn(3, hidden, generator=gen), torch.randn(3, 128, generator=gen)
    weights = {name: random_quantized(hidden, n, group, gen)
               for name, n in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d), ("gate", 64), ("up", 64))}
    down = random_quantized(128, hidden, group, gen)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in (*weights, "down")}
    for rank in range(2):
        set_tp(rank, 2)
        with quantization(AWQConfig(group)):
            qkv = QKVParallelLinear(hidden, d, heads, kv_heads)
            mlp = MergedColumnParallelLinear(hidden, [64, 64])
            row = RowParallelLinear(128, hidden)
        for layer, shards in ((qkv, ("q", "k", "v")), (mlp, ("gate", "up"))):
            for shard_id, name in enumerate(shards):
                q, z, s, _ = weights[name]
                sid = name if layer is qkv else shard_id
                _load(layer, [("qweight", pack(q), sid), ("qzeros", pack(z), sid), ("scales", s, sid)])
        q, z, s, _ = down
        _load(row, [("qweight", pack(q)), ("qzeros", pack(z)), ("scales", s)])
        out_q, out_k, out_v = qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], -1)
        out_g, out_u = mlp(x).chunk(2, -1)
        for name, out in (("q", out_q), ("k", out_k), ("v", out_v), ("gate", out_g), ("up", out_u)):
            parts[name].append(out)
        parts["down"].append(row.matmul(xi[:, rank * 64:(rank + 1) * 64], None))  # this rank's partial sum
    for name, (_, _, _, w) in weights.items():
        got = parts[name][:1] if name in ("k", "v") and kv_heads == 1 else parts[name]
        if name in ("k", "v") and kv_heads == 1:
            torch.testing.assert_close(parts[name][0], parts[name][1])
        torch.testing.assert_close(torch.cat(got, -1).double(), x.double() @ w, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close((parts["down"][0] + parts["down"][1]).double(), xi.double() @ down[3],
                               atol=1e-4, rtol=1e-4)
