"""Programmatic dependent launch of the decode kernels (csrc/programmatic_launch.cu): when the
extension says it is on, against the device, the build's archs and the switches (it then applies
from 3 rows per launch); and a chain of dependent gemv ops, at one and four rows, replayed in a
CUDA graph (where each kernel may start before the one it reads from ends) equal, bit for bit, to
the same ops run one at a time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import vllm_volta._C as ext
from vllm_volta import _custom_ops as ops, envs

from .op_cases import requires_gpu

gpu = [pytest.mark.gpu, requires_gpu]


def _expected_on() -> bool:
    props = torch.cuda.get_device_properties(0)
    archs = [int(re.match(r"\d+", a).group()) for a in ext.CUDA_ARCHS.split(",") if a]
    emulated = envs.VLLM_VOLTA_DEVICE_CAPABILITY
    volta_mode = emulated is not None and emulated < (9, 0)
    # The image that runs is the build's newest arch up to the device's: it has the instructions
    # when that arch is 9.0 or newer (the Volta build's 7.5+PTX never).
    sm = props.major * 10 + props.minor
    image = max((a for a in archs if a <= sm), default=0)
    return image >= 90 and not volta_mode and envs.VLLM_VOLTA_PDL


def test_a_malformed_switch_names_the_variable(monkeypatch):
    monkeypatch.setenv("VLLM_VOLTA_PDL", "perhaps")
    with pytest.raises(ValueError, match="VLLM_VOLTA_PDL='perhaps'"):
        ops.programmatic_launch(0)


@pytest.mark.skipif(bool(ext.BUILT_WITH_CUDA), reason="CPU builds only")
def test_off_in_a_cpu_build():
    assert ops.programmatic_launch(0) is False


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_on_where_the_device_and_build_have_it(device):
    assert ops.programmatic_launch(torch.device(device, 0)) is _expected_on()


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_switched_off_by_the_environment(device):
    code = "import vllm_volta._custom_ops as o; print(o.programmatic_launch(0))"
    env = dict(os.environ, VLLM_VOLTA_PDL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# 1-2 rows: plain launches, gemv_add in one-wave grids; 3+ rows: programmatic dependents where on.
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_dependent_gemv_chain_in_a_graph_equals_ops_one_at_a_time(device, rows):
    g = torch.Generator().manual_seed(0)
    k, big = 2048, 14336

    def weight(n, kk):
        return (torch.randn(n, kk, generator=g) / kk ** 0.5).half().to(device)

    layers = [(weight(2 * big, k), weight(k, big), weight(3 * k, k), weight(k, 3 * k)) for _ in range(6)]
    norm = (torch.rand(k, generator=g) + 0.5).half().to(device)
    x0 = torch.randn(rows, k, generator=g).half().to(device)
    residual = torch.empty_like(x0)
    act = torch.empty(rows, big, dtype=torch.float16, device=device)
    mid = torch.empty(rows, 3 * k, dtype=torch.float16, device=device)

    def chain(sync: bool):
        residual.copy_(x0)
        for gate_up, down, up3, down3 in layers:  # each op reads what the one before wrote
            for op in (lambda: torch.ops._C.gemv_silu_and_mul(act, residual, gate_up, None, 0, norm, 1e-5),
                       lambda: torch.ops._C.gemv_add(residual, act, down, None),
                       lambda: torch.ops._C.gemv(mid, residual, up3, None, 0, norm, 1e-5),
                       lambda: torch.ops._C.gemv_add(residual, mid, down3, None)):
                op()
                if sync:
                    torch.cuda.synchronize()

    chain(sync=True)
    expected = residual.clone()
    assert torch.isfinite(expected).all()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(sync=False)
    residual.zero_()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(residual, expected)
