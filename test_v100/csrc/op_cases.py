"""Shared pieces of the op tests: which (device, library) pairs to run, tolerances, and
strided-row inputs. Each test compares an op against a plain-PyTorch reference."""

from __future__ import annotations

import pytest
import torch

import vllm_volta._custom_ops  # noqa: F401  (loads vllm_volta._C)

_NO_GPU = not torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(_NO_GPU, reason="needs a CUDA GPU")

# (device, op namespace). On CUDA, `_C` is the native kernel (or the adapter in a V100
# build) and `_C_adapter` always the adapter; on CPU both are the adapter, so test one.
DEVICE_LIBS = [
    pytest.param("cpu", "_C", id="cpu"),
    pytest.param("cuda", "_C", id="cuda-C", marks=[pytest.mark.gpu, requires_gpu]),
    pytest.param("cuda", "_C_adapter", id="cuda-adapter", marks=[pytest.mark.gpu, requires_gpu]),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Tolerance of about 2 units in the last place of each dtype (kernels may round once
# differently from the reference, e.g. rsqrt vs 1/sqrt).
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


def lib(namespace: str):
    """torch.ops._C or torch.ops._C_adapter."""
    return getattr(torch.ops, namespace)


def skip_unsupported(device: str, dtype: torch.dtype) -> None:
    """BF16 kernels exist only on SM80+ and in builds with an SM80+ target (not the V100 adapter
    build run on a newer GPU; the ops raise a clear error there; tested apart)."""
    if device == "cuda" and dtype == torch.bfloat16:
        from vllm_volta import _custom_ops as ops
        if torch.cuda.get_device_capability() < (8, 0) or not ops.cuda_bf16_kernels_built():
            pytest.skip("bfloat16 needs a GPU of compute capability >= 8.0 and a build for one")


def rows_with_stride(rows: int, width: int, pad: int, *, dtype: torch.dtype, device: str,
                     seed: int = 0) -> torch.Tensor:
    """A [rows, width] view whose rows are `width + pad` elements apart (pad=0: contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(rows, width + pad, generator=gen, dtype=torch.float32).to(dtype)
    return full.to(device)[:, :width]
