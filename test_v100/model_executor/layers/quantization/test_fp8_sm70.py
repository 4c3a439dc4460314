"""Which code computes an FP8 layer's x W^T (fp8.py / fp8_sm70.py), without a GPU: the path per compute
capability (VLLM_VOLTA_DEVICE_CAPABILITY on a CUDA platform object), dtype and build, and the layer's
calls into the SM70 kernels (fp8_gemv up to 8 rows, fp8_gemm up to 128, fp8_dequantize + GEMM above) with the kernels
replaced by float64 stand-ins, checked against x W. test_v100/csrc/test_fp8_ops.py runs the kernels on a GPU."""

from __future__ import annotations

import pytest
import torch

from vllm_volta import _custom_ops as ops
from vllm_volta.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm_volta.model_executor.layers.quantization import fp8 as fp8_module
from vllm_volta.model_executor.layers.quantization import quantization
from vllm_volta.model_executor.layers.quantization.fp8 import fp8_kernel_path
from vllm_volta.model_executor.layers.quantization.fp8_sm70 import PATH_NAME, layer_fits
from vllm_volta.platforms.cuda import CudaPlatform

from .fp8_checkpoints import Fp8Scheme, config_of

CUDA = torch.device("cuda")
BLOCK = config_of(Fp8Scheme("fp8", "block", (128, 128)))  # dynamic activations: W8A8 where it can run
W8A16 = config_of(Fp8Scheme("compressed-tensors", "channel", acts=None))


@pytest.fixture
def cuda_platform(monkeypatch):
    """A CUDA platform whose capability comes from VLLM_VOLTA_DEVICE_CAPABILITY, and a build with
    the FP8 CUDA kernels; returns a setter of the capability."""
    monkeypatch.setattr("vllm_volta.platforms.current_platform", CudaPlatform(), raising=False)
    monkeypatch.setattr(ops, "has_cuda_kernel", lambda op: True)
    return lambda cap: monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)


@pytest.mark.parametrize("cap,config,path", [
    ("7.0", BLOCK, "sm70"), ("7.5", BLOCK, "sm70"), ("8.0", BLOCK, "sm70"), ("8.6", BLOCK, "sm70"),
    ("8.9", BLOCK, "triton"), ("9.0", BLOCK, "triton"),
    ("7.0", W8A16, "sm70"), ("9.0", W8A16, "sm70"),  # weight-only: no activation quantization anywhere
])
def test_path_per_capability(cuda_platform, cap, config, path):
    pytest.importorskip("triton")
    cuda_platform(cap)
    got = fp8_kernel_path(config, CUDA, torch.float16)
    if path == "triton":  # decode-sized steps take fp8_gemv (faster at one row), the rest Triton
        assert got.startswith("fp8_gemv (W8A16) for steps of up to 8 rows, the W8A8 Triton FP8 GEMM") and got.endswith("above")
    else:
        assert got.startswith(PATH_NAME) and "fp8_gemv for steps of up to 8 rows" in got and "fp8_gemm" in got
        reason = "no activation quantization" if config is W8A16 else f"SM{cap.replace('.', '')} has no FP8 tensor cores"
        assert reason in got


def test_bfloat16_from_sm80_with_bf16_kernels(cuda_platform, monkeypatch):
    monkeypatch.setattr(ops, "cuda_bf16_kernels_built", lambda: True)
    cuda_platform("8.0")
    assert fp8_kernel_path(BLOCK, CUDA, torch.bfloat16).startswith(PATH_NAME)
    cuda_platform("7.5")
    got = fp8_kernel_path(W8A16, CUDA, torch.bfloat16)
    assert got.startswith("weight-only FP8: dequantized to bfloat16 each call, then cuBLAS")
    assert "bfloat16 needs SM80+ (run --dtype half)" in got
    cuda_platform("8.0")
    monkeypatch.setattr(ops, "cuda_bf16_kernels_built", lambda: False)
    assert "this build has no bfloat16 kernels" in fp8_kernel_path(BLOCK, CUDA, torch.bfloat16)


def test_cpu_float32_and_builds_without_kernels_dequantize(cuda_platform, monkeypatch):
    cuda_platform("8.0")
    assert "compute in float16 or bfloat16 (here float32)" in fp8_kernel_path(BLOCK, CUDA, torch.float32)
    assert fp8_kernel_path(BLOCK, torch.device("cpu"), torch.float16).startswith(
        "weight-only FP8: dequantized to float16 each call, then the CPU GEMM")
    monkeypatch.setattr(ops, "has_cuda_kernel", lambda op: False)
    assert "this build of vllm_volta._C has no CUDA kernels" in fp8_kernel_path(BLOCK, CUDA, torch.float16)


def test_layer_shapes_the_kernels_take():
    assert layer_fits(4096, 128, 32) and layer_fits(400, 64, 7) and layer_fits(96, 96, 1)
    assert not layer_fits(100, 100, 1)  # K not whole 16-byte vectors
    assert not layer_fits(96, 24, 4)  # a vector would straddle two scale groups


def _stand_in_kernels(monkeypatch, calls: list[str]) -> None:
    """fp8_gemv / fp8_dequantize as float64 PyTorch with the kernels' contracts checked."""
    def dense(weight, scales, group_k):
        cols = torch.arange(weight.shape[1]) // group_k if scales.shape[1] > 1 else torch.zeros(weight.shape[1], dtype=torch.long)
        return weight.double() * scales.double()[:, cols]

    def product(out, input, weight, scales, group_k, bias):
        assert input.stride(-1) == 1 and out.dtype == input.dtype and input.data_ptr() % 16 == 0
        assert input.shape[0] == 1 or input.stride(0) % 8 == 0
        y = input.double() @ dense(weight, scales, group_k).t()
        out.copy_(y if bias is None else y + bias.double())

    def fp8_gemv(out, input, weight, scales, group_k, bias, rows_per_block=0):
        assert 1 <= input.shape[0] <= 8
        calls.append("gemv")
        product(out, input, weight, scales, group_k, bias)

    def fp8_gemm(out, input, weight, scales, group_k, bias):
        assert input.shape[0] > 8
        calls.append("gemm")
        product(out, input, weight, scales, group_k, bias)

    def fp8_dequantize(out, weight, scales, group_k):
        calls.append("dequantize")
        out.copy_(dense(weight, scales, group_k))

    monkeypatch.setattr(ops, "fp8_gemv", fp8_gemv)
    monkeypatch.setattr(ops, "fp8_gemm", fp8_gemm)
    monkeypatch.setattr(ops, "fp8_dequantize", fp8_dequantize)
    monkeypatch.setattr(fp8_module, "sm70_kernels_reason", lambda device, dtype: None)


@pytest.mark.parametrize("name,scheme", [("block", Fp8Scheme("fp8", "block", (64, 64))),
                                         ("channel", Fp8Scheme("compressed-tensors", "channel", acts=None))])
def test_layers_call_the_kernels_by_rows(monkeypatch, name, scheme):
    """Up to 8 rows through fp8_gemv, up to 128 through fp8_gemm, more through fp8_dequantize and a
    GEMM; a 3-D input, a bias;
    K = 100 (not whole vectors) stays on PyTorch's dequantization."""
    calls: list[str] = []
    _stand_in_kernels(monkeypatch, calls)
    gen = torch.Generator().manual_seed(0)
    with quantization(config_of(scheme)):
        qkv = QKVParallelLinear(192, 32, 4, 2, bias=True, params_dtype=torch.float16)
        odd = RowParallelLinear(100, 48, params_dtype=torch.float16)
    for layer, shards in ((qkv, [("q", 128), ("k", 64), ("v", 64)]), (odd, [(None, 48)])):
        params = dict(layer.named_parameters())
        dense = []
        for shard, n in shards:
            qt = scheme.quantize(torch.randn(n, layer.input_size, generator=gen) * 0.1)
            for pname, tensor in scheme.tensors(qt).items():
                params[pname].weight_loader(params[pname], tensor, *(() if shard is None else (shard,)))
            dense.append(qt.dense)
        w = torch.cat(dense)
        if layer.bias is not None:
            layer.bias.data.copy_(torch.randn(w.shape[0], generator=gen))
        for rows, want_call in ((1, "gemv"), (8, "gemv"), (9, "gemm"), (128, "gemm"), (129, "dequantize")):
            calls.clear()
            x = torch.randn(1, rows, layer.input_size, generator=gen).half()
            got = layer(x)
            want = x.double() @ w.t() + (0 if layer.bias is None else layer.bias.double())
            assert calls == ([want_call] if layer is qkv else [])
            torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)


def test_inputs_reach_the_kernels_aligned(monkeypatch):
    """Rows that are not 16-byte vectors apart (or start off a vector) are copied first; zero rows
    launch nothing."""
    calls: list[str] = []
    _stand_in_kernels(monkeypatch, calls)
    from vllm_volta.model_executor.layers.quantization.fp8_sm70 import fp8_w8a16_linear

    gen = torch.Generator().manual_seed(1)
    weight = (torch.randn(24, 64, generator=gen) * 50).to(torch.float8_e4m3fn)
    scales = torch.rand(24, 1, generator=gen) * 0.01
    wide = torch.randn(20, 80, generator=gen).half()
    for x in (wide[:3, 1:65], wide[:12, 8:72].t().contiguous().t()[:, :64], wide[:, :64][::2]):
        calls.clear()
        got = fp8_w8a16_linear(x, weight, scales, 64, None)
        want = x.double() @ (weight.double() * scales.double()).t()
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)
        assert calls and calls[0] in ("gemv", "gemm")
    calls.clear()
    assert fp8_w8a16_linear(wide[:0, :64], weight, scales, 64, None).shape == (0, 24) and not calls
