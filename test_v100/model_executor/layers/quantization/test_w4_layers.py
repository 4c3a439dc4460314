"""4-bit linear layers on a GPU (float16): AWQ and GPTQ checkpoints (in order, activation order,
symmetric / asymmetric) repack into the W4A16 kernels' layout at the first call and compute
x W through w4_gemv / w4_gemm / w4_dequantize + cuBLAS by row count, against the float64 weight
of the published format."""

from __future__ import annotations

import pytest
import torch

from test_v100.csrc.op_cases import requires_gpu
from vllm_volta.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm_volta.model_executor.layers.quantization import quantization
from vllm_volta.model_executor.layers.quantization.awq import AWQConfig

from .checkpoints import pack, random_quantized
from .int_checkpoints import Scheme, config_of
from .int_layer_checks import _quantize, feed

pytestmark = [pytest.mark.gpu, requires_gpu]
ROWS = [1, 3, 8, 9, 40, 256, 300]  # gemv, gemm, dense


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = want.abs().max().item()
    torch.testing.assert_close(got.double().cpu(), want, atol=3e-3 * scale, rtol=3e-3)


@pytest.mark.parametrize("rows", ROWS)
def test_awq_layer_repacks_and_matches(rows):
    k, n, group = 256, 200, 64
    q, z, s, w = random_quantized(k, n, group, torch.Generator().manual_seed(rows))
    with torch.device("cuda"), quantization(AWQConfig(group)):
        layer = RowParallelLinear(k, n, bias=True, params_dtype=torch.float16)
    for name, tensor in (("qweight", pack(q)), ("qzeros", pack(z)), ("scales", s)):
        param = getattr(layer, name)
        param.weight_loader(param, tensor)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2)).half()
    layer.bias.data.copy_(bias)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(3)).half()
    got = layer(x.cuda())
    # repacked as the last tensor loaded: the parameters hold the K-major layout, the zeros sz's
    assert layer.__dict__.get("w4_weights") is not None and layer.qweight.shape == (n, k // 8)
    assert layer.scales.shape == (n, k // group, 2) and layer.qzeros.numel() == 0
    _close(got, x.double() @ w + bias.double())
    _close(layer(x.cuda()), x.double() @ w + bias.double())  # served from the repacked weight again
    dense = layer.quant_method.dense_weight(layer, torch.float16)
    torch.testing.assert_close(dense.double().cpu(), w, atol=1e-3, rtol=1e-3)


SCHEMES = {
    "gptq-v1-asym": Scheme("gptq", bits=4, group=32, fmt="gptq"),
    "gptq-v2-sym": Scheme("gptq", bits=4, group=64, sym=True, fmt="gptq_v2"),
    "gptq-act-order": Scheme("gptq", bits=4, group=32, act_order=True, fmt="gptq"),
    "gptq-act-order-sym": Scheme("gptq", bits=4, group=32, sym=True, act_order=True, fmt="gptq_v2"),
}


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("name", list(SCHEMES))
def test_gptq_layers_repack_and_match(name, rows):
    scheme, gen = SCHEMES[name], torch.Generator().manual_seed(1)
    with torch.device("cuda"), quantization(config_of(scheme)):
        layer = MergedColumnParallelLinear(128, [64, 96], params_dtype=torch.float16)
    items = [(shard, _quantize(scheme, n, 128, gen)) for shard, n in ((0, 64), (1, 96))]
    feed(layer, scheme, items)
    w = torch.cat([qt.dense.t() for _, qt in items], 1)
    x = torch.randn(rows, 128, generator=gen).half()
    got = layer(x.cuda())
    assert layer.__dict__.get("w4_weights") is not None
    _close(got, x.double() @ w)
    dense = layer.quant_method.dense_weight(layer, torch.float16)
    torch.testing.assert_close(dense.double().cpu(), w, atol=2e-3, rtol=2e-3)


def test_unsupported_group_keeps_the_awq_path():
    scheme, gen = Scheme("gptq", bits=4, group=16, fmt="gptq"), torch.Generator().manual_seed(4)
    with torch.device("cuda"), quantization(config_of(scheme)):
        layer = MergedColumnParallelLinear(128, [64], params_dtype=torch.float16)
    items = [(0, _quantize(scheme, 64, 128, gen))]
    feed(layer, scheme, items)
    x = torch.randn(2, 128, generator=gen).half()
    _close(layer(x.cuda()), x.double() @ items[0][1].dense.t())
    assert layer.__dict__.get("w4_weights") is None
