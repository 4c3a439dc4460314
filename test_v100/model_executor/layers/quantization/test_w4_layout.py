"""The K-major 4-bit layout of the W4A16 kernels (w4_layout.py) and the launch choice by row count
(w4_linear.py): pure PyTorch, against the published AWQ / GPTQ formats; runs without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_v100.model_executor.layers.quantization.checkpoints import pack, pack_natural, random_quantized
from vllm_volta.model_executor.layers.quantization import w4_linear
from vllm_volta.model_executor.layers.quantization.gptq import gptq_tensor_to_awq
from vllm_volta.model_executor.layers.quantization.w4_layout import (dequantize_w4_torch, group_shift, pack_kmajor,
                                                                     repack_awq, supported, unpack_kmajor, unpack_w4)

SHAPES = [(96, 72, 32), (256, 40, 64), (160, 24, 32), (1024, 200, 1024), (512, 16, 128)]  # (K, N, group)


def _bits(word: int, shift: int) -> int:
    return (word >> shift) & 0xF


@pytest.mark.parametrize("k,n,group", SHAPES)
def test_repack_round_trip_from_awq(k, n, group):
    q, z, s, w = random_quantized(k, n, group, torch.Generator().manual_seed(k + n))
    qweight, sz = repack_awq(pack(q), pack(z), s, max_cols=16)  # several column pieces
    assert qweight.shape == (n, k // 8) and qweight.dtype == torch.int32
    assert sz.shape == (n, k // group, 2) and sz.dtype == torch.float16
    q2, z2, s2 = unpack_w4(qweight, sz)
    assert torch.equal(q2, q.to(torch.int32)) and torch.equal(z2, z.to(torch.int32)) and torch.equal(s2, s)
    assert torch.equal(dequantize_w4_torch(qweight, sz, torch.float64), w)


def test_bit_positions_are_the_documented_ones():
    # int32 j of row n holds k = 8j + 2i + h in bits 4i + 16h (what the kernels' masks assume)
    q = torch.randint(0, 16, (64, 3), generator=torch.Generator().manual_seed(0))
    packed = pack_kmajor(q)
    for n in range(3):
        for j in range(8):
            word = int(packed[n, j]) & 0xFFFFFFFF
            for i in range(4):
                for h in range(2):
                    assert _bits(word, 4 * i + 16 * h) == int(q[8 * j + 2 * i + h, n])
    assert torch.equal(unpack_kmajor(packed), q.to(torch.int32))


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_converted_then_repacked_keeps_the_weight(fmt):
    k, n, group = 128, 48, 32
    q, z, s, w = random_quantized(k, n, group, torch.Generator().manual_seed(3))
    stored = (z - 1) & 0xF if fmt == "gptq" else z  # v1 stores zero - 1
    qweight = gptq_tensor_to_awq("qweight", pack_natural(q, 0), fmt)
    qzeros = gptq_tensor_to_awq("qzeros", pack_natural(stored, 1), fmt)
    packed, sz = repack_awq(qweight, qzeros, s)
    assert torch.equal(dequantize_w4_torch(packed, sz, torch.float64), w)


def test_supported_shapes():
    assert supported(4096, 4096, 128) and supported(14336, 4096, 128) and supported(96, 8, 32)
    assert supported(4096, 8, 4096)  # one group (per channel)
    assert not supported(4096, 8, 16)  # a 32-value chunk would straddle groups
    assert not supported(96 * 3, 8, 96)  # 3 chunks per group: not a power of two
    assert not supported(80, 8, 16) and not supported(48, 8, 48)  # K not a multiple of 32
    assert group_shift(4096, 128) == 2 and group_shift(4096, 32) == 0 and group_shift(4096, 4096) == 31


@pytest.mark.parametrize("rows,kernel", [(1, "gemv"), (4, "gemv"), (5, "gemm"), (16, "gemm"), (256, "gemm"),
                                         (257, "dense"), (8192, "dense")])
def test_default_dispatch_by_row_count(rows, kernel):
    config = w4_linear.default_config(rows, 4096, 4096, num_sms=132)
    assert config["kernel"] == kernel and w4_linear.check_config(config, rows) is None
    if kernel == "gemm":  # the grid covers the SMs: blocks x splits >= 132 where K allows
        blocks = -(-4096 // config["block_n"]) * -(-rows // config["block_m"])
        assert blocks * config["splits"] >= 132 or config["splits"] == 16


@pytest.mark.parametrize("config,rows,reason", [
    ({"kernel": "gemv", "rows_per_warp": 2}, 9, "gemv serves 1 to 8 rows"),
    ({"kernel": "gemv", "rows_per_warp": 4}, 6, "'rows_per_warp' must be 1, 2 or 4"),
    ({"kernel": "gemm", "block_m": 16, "block_n": 32}, 20, "'block_m' must be one of"),
    ({"kernel": "gemm", "block_m": 32, "block_n": 64, "splits": 0}, 20, "'splits' must be an int"),
    ({"kernel": "cutlass"}, 20, "'kernel' must be one of gemv, gemm, dense"),
])
def test_bad_configs_are_named(config, rows, reason):
    assert reason in w4_linear.check_config(config, rows)


def test_tuned_file_is_used_and_unusable_entries_fall_back(tmp_path, monkeypatch):
    from vllm_volta.kernel_configs import clear_kernel_config_cache, write_kernel_config

    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    monkeypatch.setitem(w4_linear._Launch._cache, 0, ("Test GPU", 132))
    shape = dict(n=64, k=128, group_size=32, dtype="float16")
    write_kernel_config(w4_linear.OP, {1: {"kernel": "gemv", "rows_per_warp": 4},
                                       8: {"kernel": "gemv", "rows_per_warp": 2},
                                       64: {"kernel": "gemm", "block_m": 64, "block_n": 32, "splits": 2}},
                        device_name="Test GPU", **shape)
    w = w4_linear.W4Weights(torch.zeros(64, 16, dtype=torch.int32), torch.zeros(64, 4, 2, dtype=torch.float16), 32)
    device = torch.device("cuda", 0)
    try:
        assert w4_linear.choose_config(1, w, device) == {"kernel": "gemv", "rows_per_warp": 4}
        assert w4_linear.choose_config(40, w, device)["block_m"] == 64
        # 12 rows: the nearest tuned size is 8 (gemv), which cannot serve 12 rows -> the default
        assert w4_linear.choose_config(12, w, device) == w4_linear.default_config(12, 64, 128, 132)
        assert w4_linear.choose_config(5, w, device) == {"kernel": "gemv", "rows_per_warp": 2}
    finally:
        clear_kernel_config_cache()


def _dequant8_like_the_kernel(words: np.ndarray, s: np.float16, z: np.float16) -> np.ndarray:
    """kernels/w4.cuh's w4_dequant8 in NumPy float16: the 0x6400 magic-number halves of the masked
    nibbles, minus (1024 + z) or times 1/16 minus (64 + z), times s; 8 weights per int32 in k order."""
    def halves(bits: np.ndarray) -> np.ndarray:  # uint32 -> (low, high) float16
        return bits.astype(np.uint32).view(np.float16).reshape(-1, 2)

    w = words.astype(np.uint32)
    magic, lo, hi = np.uint32(0x64006400), np.uint32(0x000F000F), np.uint32(0x00F000F0)
    nz1024, nz64, sixteenth = -(np.float16(1024) + z), -(np.float16(64) + z), np.float16(0.0625)
    pairs = [halves((w & lo) | magic) + nz1024, halves((w & hi) | magic) * sixteenth + nz64,
             halves(((w >> 8) & lo) | magic) + nz1024, halves(((w >> 8) & hi) | magic) * sixteenth + nz64]
    return (np.stack(pairs, 1) * s).reshape(-1, 8)  # [word, (pair, half)] = k order


def test_the_kernels_integer_dequantization_is_exact_on_this_layout():
    q = torch.randint(0, 16, (256, 4), generator=torch.Generator().manual_seed(1))
    packed = pack_kmajor(q).numpy()
    for n in range(4):
        for z in (0, 7, 15):
            s = np.float16(0.0123)
            got = _dequant8_like_the_kernel(packed[n], s, np.float16(z)).reshape(-1)
            want = ((q[:, n] - z).double() * float(s)).half().numpy()  # one float16 rounding
            assert np.array_equal(got, want)


@pytest.mark.parametrize("sym", [False, True])
def test_gptq_act_order_layer_sorted_then_repacked_keeps_the_weight(sym):
    from vllm_volta.model_executor.layers.linear import MergedColumnParallelLinear
    from vllm_volta.model_executor.layers.quantization import quantization

    from .int_checkpoints import Scheme, config_of
    from .int_layer_checks import _quantize, feed

    scheme, gen = Scheme("gptq", bits=4, group=32, sym=sym, act_order=True), torch.Generator().manual_seed(6)
    with quantization(config_of(scheme)):
        layer = MergedColumnParallelLinear(128, [64, 32], params_dtype=torch.float32)
    items = [(shard, _quantize(scheme, n, 128, gen)) for shard, n in ((0, 64), (1, 32))]
    feed(layer, scheme, items)
    perm = layer.quant_perm  # rows sorted by group into AWQ's layout (CPU: not repacked further)
    assert layer.__dict__.get("w4_weights") is None
    qweight, zeros, scales = layer.quant_method.tensors(layer)
    packed, sz = repack_awq(qweight, zeros, scales.half())
    want = torch.cat([qt.dense.t() for _, qt in items], 1)[perm]  # W with its rows in perm's order
    torch.testing.assert_close(dequantize_w4_torch(packed, sz, torch.float64), want, atol=1e-3, rtol=1e-3)
