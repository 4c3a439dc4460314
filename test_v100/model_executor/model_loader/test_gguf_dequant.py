"""gguf_dequant against the gguf package's numpy reference (gguf.quants.dequantize)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants

from vllm_volta.model_executor.model_loader.gguf_dequant import SUPPORTED_TYPES, dequantize

# Byte offsets of the fp16 scale fields in each block: random bytes there could be inf/nan,
# so the tests write finite halves into them and keep every other byte random.
_F16_FIELDS = {
    T.Q8_0: (0,),
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}
_REQUIRED = {T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K}


def _random_blocks(qtype: T, num_blocks: int, rng: np.random.Generator) -> np.ndarray:
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(num_blocks, block_bytes), dtype=np.uint8)
    for offset in _F16_FIELDS[qtype]:
        halves = rng.uniform(-2.0, 2.0, size=num_blocks).astype(np.float16)
        raw[:, offset : offset + 2] = halves.view(np.uint8).reshape(num_blocks, 2)
    return raw


def test_supports_the_issue_types():
    assert _REQUIRED <= SUPPORTED_TYPES
    assert set(_F16_FIELDS) | {T.F32, T.F16, T.BF16} == SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda t: t.name)
def test_quantized_matches_gguf_reference(qtype: T):
    rng = np.random.default_rng(int(qtype))
    block_elems, _ = GGML_QUANT_SIZES[qtype]
    rows, blocks_per_row = 6, 3
    raw = _random_blocks(qtype, rows * blocks_per_row, rng).reshape(rows, -1)
    expected = quants.dequantize(raw, qtype)  # [rows, blocks_per_row * block_elems]
    out = dequantize(raw, qtype, (rows, blocks_per_row * block_elems))
    assert out.dtype == torch.float32
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_quantize_dequantize_round_trip(qtype: T):
    # Quantizing real-valued data with the reference and decoding must land near the input.
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    raw = quants.quantize(x, qtype)
    out = dequantize(raw, qtype, x.shape).numpy()
    np.testing.assert_allclose(out, quants.dequantize(raw, qtype), rtol=1e-6)
    assert np.abs(out - x).max() < 0.35 * np.abs(x).max()


@pytest.mark.parametrize(
    "qtype,np_dtype,torch_dtype",
    [(T.F32, np.float32, torch.float32), (T.F16, np.float16, torch.float16)],
    ids=["F32", "F16"],
)
def test_float_types_keep_their_dtype_and_copy(qtype, np_dtype, torch_dtype):
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np_dtype)
    x.setflags(write=False)  # like the reader's memmap
    out = dequantize(x, qtype, (3, 5))
    assert out.dtype == torch_dtype
    torch.testing.assert_close(out, torch.from_numpy(x.copy()), rtol=0, atol=0)
    out.add_(1)  # writable and not aliasing the file
    assert not np.shares_memory(out.numpy(), x)


def test_bf16_from_raw_bytes():
    x = torch.randn(4, 8).to(torch.bfloat16)
    raw = x.view(torch.uint8).numpy()  # the reader hands BF16 over as bytes
    out = dequantize(raw, T.BF16, (4, 8))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, x)


def test_shape_is_torch_order():
    # One row of 2 blocks vs two rows of 1 block: same bytes, rows follow the slow dimension.
    raw = _random_blocks(T.Q8_0, 2, np.random.default_rng(3))
    flat = dequantize(raw, T.Q8_0, (64,))
    two_rows = dequantize(raw, T.Q8_0, (2, 32))
    assert torch.equal(two_rows[1], flat[32:])


def test_unsupported_type_names_tensor_and_type():
    raw = np.zeros(GGML_QUANT_SIZES[T.IQ2_XXS][1], dtype=np.uint8)
    with pytest.raises(ValueError, match=r"blk\.3\.ffn_up\.weight.*IQ2_XXS.*Q4_K"):
        dequantize(raw, T.IQ2_XXS, (256,), name="blk.3.ffn_up.weight")


def test_size_errors_name_tensor():
    raw = np.zeros(34 * 2, dtype=np.uint8)
    with pytest.raises(ValueError, match="my.weight.*bytes"):
        dequantize(raw, T.Q8_0, (3, 32), name="my.weight")
    with pytest.raises(ValueError, match="my.weight.*block size 32"):
        dequantize(raw, T.Q8_0, (4, 16), name="my.weight")
    with pytest.raises(ValueError, match="unknown GGML type id 999"):
        dequantize(raw, 999, (64,))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda t: t.name)
def test_decoding_on_gpu_matches_cpu(qtype: T):
    block_elems, _ = GGML_QUANT_SIZES[qtype]
    raw = _random_blocks(qtype, 8, np.random.default_rng(4))
    cpu = dequantize(raw, qtype, (8 * block_elems,))
    gpu = dequantize(raw, qtype, (8 * block_elems,), device="cuda")
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-6, atol=0)
