"""The Triton W8A8 FP8 GEMM (fp8_kernels.py) against float64 references of the dequantized
product: the activation quantizer, the GEMM over launch configs and shapes (partial tiles and
groups, per-row and per-channel weight scales), the tuned-config lookup it launches with, FP8
layers and a whole model on the W8A8 path. Needs a GPU with FP8 tensor cores (SM89+, an H200);
on the CPU only the GEMM's indexing runs, in Triton's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

FP8 = torch.float8_e4m3fn
_SM89 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
needs_sm89 = pytest.mark.skipif(not _SM89, reason="needs a CUDA GPU with FP8 tensor cores (SM89+)")


def ref_quant(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q fp8, scales [M, ceil(K / group)]): amax / 448 per token and group."""
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.nn.functional.pad(x.float(), (0, groups * group - k)).view(m, groups, group)
    scales = padded.abs().amax(-1).clamp_min(1e-10) / 448.0
    q = (padded / scales[..., None]).clamp(-448, 448).to(FP8).view(m, -1)[:, :k]
    return q.contiguous(), scales


def ref_mm(q, q_scales, w, w_scales, group) -> torch.Tensor:
    """float64 (q * q_scales) (w * w_scales)^T, each scale over its group of K."""
    k = q.shape[1]
    a = q.double() * q_scales.double().repeat_interleave(group, 1)[:, :k]
    ws = w_scales.double() if w_scales.shape[1] == 1 else w_scales.double().repeat_interleave(group, 1)[:, :k]
    return a @ (w.double() * ws).t()


def random_weight(n: int, k: int, group: int, per_channel: bool, gen: torch.Generator):
    w = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(FP8)
    scales = torch.rand(n, 1 if per_channel else -(-k // group), generator=gen) * 1e-3 + 1e-4
    return w, scales


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the compiled kernel (the tests below); "
                    "older Triton interpreters (3.6) cannot run a loop bounded by tl.cdiv")
def test_gemm_indexing_in_triton_interpreter():
    """The GEMM kernel's tiles, masks, grouped order and scale indexing, on the CPU (Triton's
    interpreter): partial M / N / K tiles, a partial last K group, per-channel scales."""
    pytest.importorskip("triton")
    code = textwrap.dedent("""
        import torch
        from vllm_volta.model_executor.layers.quantization import fp8_kernels as fk
        from test_v100.model_executor.layers.quantization.test_fp8_kernels import ref_mm, ref_quant, random_weight
        gen = torch.Generator().manual_seed(0)
        for m, n, k, per_channel, cfg in [
                (5, 48, 200, False, (16, 32, 32, 2)), (33, 40, 128, True, (32, 16, 64, 1)),
                (17, 70, 192, False, (16, 64, 64, 4))]:
            q, qs = ref_quant(torch.randn(m, k, generator=gen), 64)
            w, ws = random_weight(n, k, 64, per_channel, gen)
            config = dict(zip(("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M"), cfg))
            out = fk.w8a8_scaled_mm(q, qs, w, ws, 64, torch.float32, config | dict(num_warps=4, num_stages=2))
            want = ref_mm(q, qs, w, ws, 64)
            torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=root)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,k,group", [(1, 128, 128), (37, 320, 128), (300, 256, 64), (4, 200, 200)])
@pytest.mark.gpu
@needs_sm89
def test_per_token_group_quant(m, k, group, dtype):
    from vllm_volta.model_executor.layers.quantization.fp8_kernels import per_token_group_quant_fp8

    x = torch.randn(m, k, device="cuda", dtype=dtype) * 3
    x[0, :group] = 0  # an all-zero group: a tiny scale, zeros out
    q, scales = per_token_group_quant_fp8(x, group)
    ref_q, ref_scales = ref_quant(x, group)
    assert q.dtype == FP8 and q.shape == x.shape and scales.shape == (m, -(-k // group))
    torch.testing.assert_close(scales, ref_scales, rtol=1e-6, atol=0)
    assert (q.float() == ref_q.float()).float().mean() > 0.99  # division rounding may flip a tie
    deq = q.float() * scales.repeat_interleave(group, 1)[:, :k]
    assert bool(((deq - x.float()).abs() <= x.float().abs() / 16 + scales.max() * 2**-9).all())
    assert bool((q[0, :group].float() == 0).all())


CONFIGS = [None, (16, 32, 64, 1, 4, 3), (64, 128, 128, 16, 4, 4), (128, 64, 64, 32, 8, 2), (32, 256, 128, 64, 8, 5)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("m,n,k", [(1, 96, 128), (7, 256, 384), (64, 200, 320), (300, 512, 256)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.gpu
@needs_sm89
def test_w8a8_gemm_matches_float64(m, n, k, per_channel, config):
    from vllm_volta.kernel_configs import default_w8a8_block_fp8_config
    from vllm_volta.model_executor.layers.quantization.fp8_kernels import w8a8_scaled_mm

    gen = torch.Generator().manual_seed(m + n + k)
    q, qs = ref_quant(torch.randn(m, k, generator=gen), 128)
    w, ws = random_weight(n, k, 128, per_channel, gen)
    keys = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
    cfg = default_w8a8_block_fp8_config((128, 128)) if config is None else dict(zip(keys, config))
    want = ref_mm(q, qs, w, ws, 128)
    # float32 out: Hopper's FP8 tensor cores accumulate within a K tile at reduced precision
    # (measured on an H200: up to 9e-4 relative), the kernel promotes to FP32 between tiles.
    for out_dtype, rtol in ((torch.float32, 2e-3), (torch.float16, 3e-3), (torch.bfloat16, 1e-2)):
        out = w8a8_scaled_mm(q.cuda(), qs.cuda(), w.cuda(), ws.cuda(), 128, out_dtype, cfg)
        assert out.dtype == out_dtype and out.shape == (m, n)
        torch.testing.assert_close(out.double().cpu(), want, rtol=rtol, atol=rtol * want.abs().max().item())


@pytest.mark.gpu
@needs_sm89
def test_tuned_config_file_is_what_launches(monkeypatch, tmp_path):
    """A file under vLLM's name in VLLM_TUNED_CONFIG_FOLDER for this GPU: the nearest batch
    size's entry is the launch config, and the result is still right."""
    from vllm_volta import kernel_configs as kc
    from vllm_volta.model_executor.layers.quantization import fp8_kernels as fk

    n, k = 384, 256
    table = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
                   "num_stages": 3},
             "64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8, "num_warps": 4,
                    "num_stages": 4}}
    name = kc.w8a8_block_fp8_file_name(n, k, [128, 128], device_name=torch.cuda.get_device_name())
    (tmp_path / name).write_text(json.dumps(table))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    monkeypatch.delenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", raising=False)
    kc.clear_kernel_config_cache()
    seen = []
    real = fk.w8a8_scaled_mm
    monkeypatch.setattr(fk, "w8a8_scaled_mm", lambda *a: seen.append(a[-1]) or real(*a))
    gen = torch.Generator().manual_seed(0)
    w, ws = random_weight(n, k, 128, False, gen)
    for m, key in ((3, "1"), (40, "64"), (1000, "64")):
        x = torch.randn(m, k, generator=gen)
        out = fk.w8a8_block_fp8_linear(x.cuda().half(), w.cuda(), ws.cuda(), (128, 128))
        q, qs = ref_quant(x.half(), 128)
        want = ref_mm(q, qs, w, ws, 128)
        torch.testing.assert_close(out.double().cpu(), want, rtol=2e-3, atol=2e-3 * want.abs().max().item())
        assert seen[-1] == table[key]
    kc.clear_kernel_config_cache()


@pytest.mark.parametrize("name", ["fp8-block-128", "ct-channel", "fp8-tensor-static"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.gpu
@needs_sm89
def test_layers_take_the_w8a8_path(name, dtype, monkeypatch):
    """FP8 layers on an SM89+ GPU run the Triton GEMM (activations quantized per token and 128
    group): within FP8 activation noise of x W, and tight against the same quantization in
    float64; with VLLM_VOLTA_DEVICE_CAPABILITY=7.0 the same checkpoint takes the weight-only path."""
    from vllm_volta.model_executor.layers.linear import MergedColumnParallelLinear
    from vllm_volta.model_executor.layers.quantization import fp8_kernels as fk, quantization

    from .fp8_checkpoints import Fp8Scheme, config_of

    scheme = {"fp8-block-128": Fp8Scheme(), "ct-channel": Fp8Scheme("compressed-tensors", "channel"),
              "fp8-tensor-static": Fp8Scheme("fp8", "tensor", acts="static")}[name]
    calls = []
    real = fk.w8a8_block_fp8_linear
    monkeypatch.setattr(fk, "w8a8_block_fp8_linear", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 320, generator=gen)
    ws = [torch.randn(n, 320, generator=gen) * 0.05 for n in (256, 200)]
    outs = {}
    for cap in (None, "7.0"):
        if cap:
            monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
        with torch.device("cuda"), quantization(config_of(scheme)):
            layer = MergedColumnParallelLinear(320, [256, 200], params_dtype=dtype)
        dense = []
        for shard, w in enumerate(ws):
            qt = scheme.quantize(w)
            for pname, tensor in scheme.tensors(qt).items():
                getattr(layer, pname).weight_loader(getattr(layer, pname), tensor, shard)
            dense.append(qt.dense)
        outs[cap] = layer(x.cuda().to(dtype)).double().cpu()
        assert len(calls) == 1  # the native run called the Triton GEMM; the 7.0 run did not
    w = torch.cat(dense)
    q, qs = ref_quant(x.to(dtype), 128)
    a = q.double() * qs.double().repeat_interleave(128, 1)[:, :320]
    exact, rtol = x.to(dtype).double() @ w.t(), (1e-2 if dtype == torch.float16 else 2e-2)
    torch.testing.assert_close(outs[None], a @ w.t(), rtol=rtol, atol=rtol * exact.abs().max().item())
    assert (outs[None] - exact).norm() / exact.norm() < 0.06  # FP8 activations: a few % noise
    torch.testing.assert_close(outs["7.0"], exact, rtol=rtol, atol=rtol * exact.abs().max().item())


def _engine_sized_fp8_model(folder):
    """A block-FP8 Llama of the GPU engine tests' size (weights of a trained model's scale)."""
    import transformers

    from test_v100.model_executor.models.hf_compare import TINY, save_random_hf_model

    from .fp8_checkpoints import Fp8Scheme, quantize_hf_model

    config = transformers.LlamaConfig(**{**TINY, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
                                         "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 384})
    hf = save_random_hf_model(config, folder / "dense")
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(0.3)
    quantize_hf_model(hf, folder, Fp8Scheme("fp8", "block", (128, 128)))
    return hf


@pytest.mark.gpu
@needs_sm89
def test_model_on_the_w8a8_path(tmp_path, monkeypatch):
    """A block-FP8 Llama in float16 on the GPU: the W8A8 path's logits track transformers' on the
    dequantized weights within FP8 activation noise (about 4 % here, emulated on the CPU), the
    weight-only path's (VLLM_VOLTA_DEVICE_CAPABILITY=7.0, a V100's) within float16 noise."""
    from test_v100.model_executor.models.hf_compare import PagedRunner, hf_logits, load_ours

    hf = _engine_sized_fp8_model(tmp_path)
    tokens = torch.randint(0, 384, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    want = hf_logits(hf, tokens)
    for cap, limit in ((None, 0.1), ("7.0", 0.01)):
        if cap:
            monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
        model = load_ours(tmp_path, dtype=torch.float16, device="cuda")
        got = PagedRunner(model, device="cuda").step({"x": tokens})["x"]
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < limit, (cap, rel)


@pytest.mark.gpu
@needs_sm89
def test_fp16_engine_logprobs_on_the_w8a8_path(tmp_path):
    """The engine as users run it (float16, CUDA graphs) on a block-FP8 checkpoint: every token's
    logprob within 0.1 of transformers' on the dequantized weights (FP8 activation noise: about
    0.02, emulated on the CPU)."""
    from test_v100.model_executor.models.hf_compare import check_engine_logprobs

    check_engine_logprobs(tmp_path, _engine_sized_fp8_model(tmp_path))


def test_tuner_search_space_and_shapes(tmp_path):
    """benchmarks/kernels/benchmark_w8a8_block_fp8.py: vLLM's search space (BLOCK_SIZE_K dividing
    the scale block), per-rank shapes of a decoder, and its argument checks."""
    from benchmarks.kernels import benchmark_w8a8_block_fp8 as tuner

    full = tuner.search_space(128)
    assert len(full) == 4 * 5 * 2 * 4 * 2 * 4 and all(set(c) == set(tuner.SEARCH_SPACE) for c in full)
    assert len({tuple(sorted(c.items())) for c in full}) == len(full)
    assert all(c["BLOCK_SIZE_K"] == 64 for c in tuner.search_space(64))
    qwen3_8b = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "intermediate_size": 12288}
    assert tuner.model_shapes(qwen3_8b, 2) == [(3072, 4096), (4096, 2048), (12288, 4096), (4096, 6144)]
    assert tuner.model_shapes(qwen3_8b, 16)[0] == (32 * 128 // 16 + 2 * 128, 4096)  # a kv head per rank
    (tmp_path / "config.json").write_text(json.dumps(qwen3_8b))
    args = tuner.parse_args(["--model-config", str(tmp_path), "-tp", "2", "--batch-size", "16"])
    assert args.shapes[0] == (3072, 4096) and args.batch_sizes == [16] and not args.tune
    assert tuner.parse_args(["--shapes", "256,512", "7,9"]).shapes == [(256, 512), (7, 9)]
    assert tuner.parse_args(["--shapes", "1,1"]).batch_sizes == list(tuner.BATCH_SIZES)
    for bad in (["--shapes", "256"], [], ["--shapes", "1,1", "--model-config", "x"], ["--shapes", "0,4"],
                ["--shapes", "1,1", "--tp-size", "0"]):
        with pytest.raises(SystemExit):
            tuner.parse_args(bad)
    with pytest.raises(ValueError, match="--tp-size 3 must divide the model's num_attention_heads 32"):
        tuner.model_shapes(qwen3_8b, 3)


@pytest.mark.gpu
@needs_sm89
def test_tuner_writes_a_file_the_lookup_uses(tmp_path, monkeypatch):
    """--tune --search small on one shape: the vLLM-named file it writes is the one looked up."""
    from benchmarks.kernels import benchmark_w8a8_block_fp8 as tuner
    from vllm_volta import kernel_configs as kc

    result = tuner.main(["--tune", "--search", "small", "--shapes", "256,512", "--batch-sizes", "1", "48",
                         "--save-path", str(tmp_path)])
    name = kc.w8a8_block_fp8_file_name(256, 512, [128, 128], device_name=torch.cuda.get_device_name())
    assert result["config_files"] == [str(tmp_path / name)]
    table = json.loads((tmp_path / name).read_text())
    assert list(table) == ["1", "48"]
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    kc.clear_kernel_config_cache()
    assert kc.get_w8a8_block_fp8_config(40, 256, 512, [128, 128]) == table["48"]
    timed = tuner.main(["--shapes", "256,512", "--batch-sizes", "2"])
    assert timed["results"][0]["config"] == table["1"] and timed["results"][0]["us"] > 0
    kc.clear_kernel_config_cache()
