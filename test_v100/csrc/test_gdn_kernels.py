"""Gated DeltaNet CUDA kernels (csrc/gdn_kernels.cu) against the PyTorch path run in float64 on
the same (rounded) inputs: float16 and float32 activations (bfloat16 on SM80+), float32 and
activation-dtype states, awkward head sizes (Dv not a multiple of 4, Dk not a power of 2),
GQA, strided q / k / v views, fused and precomputed gates, every tile width, a padded row on
the scratch slot 0 and a skipped row (slot -1), chunked prefill continued by decodes.
The check_* helpers take the device so the same cases run on CPU as a self-check."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.model_executor.layers import gdn_ops
from vllm_volta.model_executor.layers import gdn_reference as ref

from .gdn_cases import continue_across_calls, make_conv, make_gdn
from .op_cases import requires_gpu, skip_unsupported

pytestmark = [pytest.mark.gpu, requires_gpu]

OUT_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=1e-2),
           torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
STATE_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=1e-2, rtol=1e-2),
             torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}
SHAPES = [(16, 32, 128, 128), (2, 6, 64, 40), (1, 3, 100, 24), (3, 3, 48, 30), (2, 2, 256, 20), (1, 1, 1, 1)]


def _reference(x: dict, lens_init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs and states of the call in float64 on CPU (the inputs as the kernel reads them)."""
    d = {k: (v.cpu().double() if isinstance(v, torch.Tensor) and v.is_floating_point() else
             v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    out = torch.empty(d["v"].shape, dtype=torch.float64)
    ref.gated_delta_rule(d["q"], d["k"], d["v"], d["a"], d["b"], d["state"], d["state_slots"],
                         d["query_start_loc"], lens_init, d["q"].shape[-1] ** -0.5, True, d["A_log"],
                         d["dt_bias"], out)
    return out, d["state"]


def check_decode(device: str, shape, batch: int, dtype, state_dtype, fused: bool, col_threads: int = 0) -> None:
    hk, hv, dk, dv = shape
    g = make_gdn([1] * batch, hk, hv, dk, dv, dtype=dtype, fused=fused, strided=True, num_slots=batch + 3,
                 state_dtype=state_dtype, seed=batch * 7 + dk, device=device)
    assert batch == 1 or g["q"].stride(0) > hk * dk  # token rows strided, as views of the conv output are
    if batch >= 3:  # a padded row on the scratch slot, a skipped row
        g["state_slots"][1], g["state_slots"][2] = 0, -1
    state0 = g["state"].cpu()
    expected_out, expected_state = _reference(g, None)
    out = torch.full(g["v"].shape, float("nan"), dtype=dtype, device=device)
    if col_threads:
        from vllm_volta import _custom_ops
        _custom_ops.gated_delta_rule_decode(out, g["q"], g["k"], g["v"], g["a"], g["b"], g["state"],
                                            g["state_slots"], dk ** -0.5, True, g["A_log"], g["dt_bias"], col_threads)
    else:
        gdn_ops.gated_delta_rule_decode(g["q"], g["k"], g["v"], g["a"], g["b"], g["state"], g["state_slots"],
                                        A_log=g["A_log"], dt_bias=g["dt_bias"], out=out)
    torch.testing.assert_close(out.cpu().double(), expected_out, **OUT_TOL[dtype])
    torch.testing.assert_close(g["state"].cpu().double(), expected_state, **STATE_TOL[state_dtype])
    untouched = [s for s in range(state0.shape[0]) if s not in g["state_slots"].tolist()]
    assert torch.equal(g["state"].cpu()[untouched], state0[untouched])


def check_prefill(device: str, shape, dtype, state_dtype, fused: bool) -> None:
    hk, hv, dk, dv = shape
    lens = [1, 17, 0, 40, 3]
    init = torch.tensor([True, False, True, True, False])
    g = make_gdn(lens, hk, hv, dk, dv, dtype=dtype, fused=fused, strided=True, state_dtype=state_dtype, seed=dk,
                 device=device)
    g["state_slots"][4] = -1
    expected_out, expected_state = _reference(g, init)
    out = gdn_ops.gated_delta_rule_prefill(g["q"], g["k"], g["v"], g["a"], g["b"], g["state"], g["state_slots"],
                                           g["query_start_loc"], init.to(device), A_log=g["A_log"],
                                           dt_bias=g["dt_bias"])
    torch.testing.assert_close(out.cpu().double(), expected_out, **OUT_TOL[dtype])
    torch.testing.assert_close(g["state"].cpu().double(), expected_state, **STATE_TOL[state_dtype])


def check_continuation(device: str, dtype) -> None:
    x = make_gdn([23], 16, 32, 128, 128, dtype=dtype, seed=3)
    init = torch.tensor([False])
    expected_out, expected_state = _reference(x, init)
    out, state = continue_across_calls(dict(x, state=x["state"].clone()), 9, 4, device)
    torch.testing.assert_close(out.double(), expected_out, **OUT_TOL[dtype])
    torch.testing.assert_close(state.double(), expected_state, **STATE_TOL[torch.float32])


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("batch", [1, 5, 67])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_decode_matches_float64_reference(dtype, shape, batch, fused):
    skip_unsupported("cuda", dtype)
    check_decode("cuda", shape, batch, dtype, torch.float32, fused)


@pytest.mark.parametrize("col_threads", [2, 4, 8])
@pytest.mark.parametrize("batch", [1, 33])
def test_decode_every_tile_width(col_threads, batch):
    check_decode("cuda", (16, 32, 128, 128), batch, torch.float16, torch.float32, True, col_threads)


@pytest.mark.parametrize("shape", [(16, 32, 128, 128), (3, 3, 48, 30)], ids=["qwen3.5-9b", "odd"])
def test_decode_half_state(shape):
    check_decode("cuda", shape, 9, torch.float16, torch.float16, True)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_prefill_matches_float64_reference(dtype, shape, fused):
    check_prefill("cuda", shape, dtype, torch.float32, fused)


def test_prefill_half_state():
    check_prefill("cuda", (2, 6, 64, 40), torch.float16, torch.float16, True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_chunked_prefill_then_decodes_equal_one_prefill(dtype):
    check_continuation("cuda", dtype)


def check_conv(device: str, width: int, dtype, transposed_state: bool, bias: bool) -> None:
    lens = [1, 9, 0, 2, 5]
    init = torch.tensor([True, False, True, True, True])
    g = make_conv(lens, 300, width, dtype=dtype, bias=bias, transposed_state=transposed_state, strided=True,
                  seed=width, device=device)
    assert g["x"].stride(0) > 300 and (width == 2 or (g["conv_state"].stride(2) == 300) == transposed_state)
    g["state_slots"][4] = -1
    d = {k: (v.cpu().double() if isinstance(v, torch.Tensor) and v.is_floating_point() else
             None if v is None else v.cpu()) for k, v in g.items()}
    expected = gdn_ops.causal_conv1d_fn(d["x"], d["weight"], d["bias"], d["conv_state"], d["query_start_loc"],
                                        d["state_slots"], init)
    out = gdn_ops.causal_conv1d_fn(g["x"], g["weight"], g["bias"], g["conv_state"], g["query_start_loc"],
                                   g["state_slots"], init.to(device))
    torch.testing.assert_close(out.cpu().double(), expected, **OUT_TOL[dtype])
    assert torch.equal(g["conv_state"].cpu(), d["conv_state"].to(dtype))  # state entries are copied inputs
    # Then one decode step per sequence (the skipped one included).
    x1 = torch.randn(len(lens), 300, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = gdn_ops.causal_conv1d_update(x1.double(), d["weight"], d["bias"], d["conv_state"], d["state_slots"])
    out = gdn_ops.causal_conv1d_update(x1.to(device), g["weight"], g["bias"], g["conv_state"], g["state_slots"])
    torch.testing.assert_close(out.cpu().double(), expected, **OUT_TOL[dtype])
    assert torch.equal(g["conv_state"].cpu(), d["conv_state"].to(dtype))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposed_state", [False, True])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_causal_conv1d_matches_float64_reference(dtype, width, transposed_state, bias):
    check_conv("cuda", width, dtype, transposed_state, bias)


def test_ops_opcheck():
    x = make_gdn([1, 1], 2, 4, 16, 8, dtype=torch.float16, device="cuda")
    out = torch.empty(x["v"].shape, dtype=torch.float16, device="cuda")
    torch.library.opcheck(torch.ops._C.gated_delta_rule_decode.default,
                          (out, x["q"], x["k"], x["v"], x["a"], x["b"], x["state"], x["state_slots"], 0.25, True,
                           x["A_log"], x["dt_bias"], 0))
    torch.library.opcheck(torch.ops._C.gated_delta_rule_prefill.default,
                          (out, x["q"], x["k"], x["v"], x["a"], x["b"], x["state"], x["state_slots"],
                           x["query_start_loc"], None, 0.25, True, x["A_log"], x["dt_bias"], 0))
    c = make_conv([2, 1], 40, 4, dtype=torch.float16, device="cuda")
    out = torch.empty(c["x"].shape, dtype=torch.float16, device="cuda")
    torch.library.opcheck(torch.ops._C.causal_conv1d_fn.default,
                          (out, c["x"], c["weight"], c["bias"], c["conv_state"], c["query_start_loc"],
                           c["state_slots"], None, True))
    torch.library.opcheck(torch.ops._C.causal_conv1d_update.default,
                          (out[:2], c["x"][:2], c["weight"], c["bias"], c["conv_state"], c["state_slots"], True))
