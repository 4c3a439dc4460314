"""MoE routing and expert order in PyTorch (the CPU path and the kernels' reference) against
definitions written out by hand; the MoE layer's device path (decode GEMVs, grouped GEMM, CUDA
graphs with padded rows) against the host-grouped path and a float64 reference on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from test_v100.csrc.op_cases import skip_unsupported
from vllm_volta.model_executor.layers import fused_moe
from vllm_volta.model_executor.layers.moe import MoE, supports_cuda_graphs
from vllm_volta.model_executor.layers.moe_routing import align_reference, select_experts

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_select_experts_follows_the_definition(scoring, renormalize):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 10, generator=g)
    weights, ids = select_experts(logits, 3, renormalize, scoring)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    for t in range(6):
        scores = [(torch.exp(v) / torch.exp(logits[t]).sum() if scoring == "softmax" else 1 / (1 + torch.exp(-v)))
                  for v in logits[t]]
        best = sorted(range(10), key=lambda e: -float(scores[e]))[:3]
        chosen = torch.tensor([float(scores[e]) for e in best])
        if renormalize:
            chosen = chosen / chosen.sum()
        assert ids[t].tolist() == best
        torch.testing.assert_close(weights[t], chosen)


def test_select_experts_bad_scoring():
    with pytest.raises(ValueError, match=r"scoring_func must be one of \('softmax', 'sigmoid'\), got 'relu'"):
        select_experts(torch.zeros(1, 4), 2, True, "relu")


@pytest.mark.parametrize("tokens,experts,k,block", [(1, 4, 2, 16), (9, 5, 3, 4), (40, 16, 4, 8), (3, 8, 1, 1)])
def test_align_reference_follows_the_definition(tokens, experts, k, block):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]).int()
    sorted_ids, experts_ids, total = align_reference(ids, experts, block)
    pairs = tokens * k
    # By hand: each expert's pairs in pair order, then padding to a multiple of block.
    expected, expected_experts = [], []
    for e in range(experts):
        mine = [p for p in range(pairs) if ids.flatten()[p] == e]
        run = mine + [pairs] * (-len(mine) % block)
        expected += run
        expected_experts += [e] * (len(run) // block)
    assert int(total) == len(expected)
    assert sorted_ids[:len(expected)].tolist() == expected
    assert (sorted_ids[len(expected):] == pairs).all() and len(sorted_ids) == pairs + experts * (block - 1)
    assert experts_ids[:len(expected_experts)].tolist() == expected_experts
    assert (experts_ids[len(expected_experts):] == -1).all()


def test_default_config_and_config_checks():
    assert fused_moe.default_config(1, 128, 8, torch.float16)["path"] == "gemv"
    assert fused_moe.default_config(512, 128, 8, torch.float16) == {"path": "gemm", "block_size": 32}
    assert fused_moe.default_config(512, 128, 8, torch.float32) == {"path": "host"}  # no tensor-core float32
    # Inside a CUDA-graph capture the host path (a sync per call) gives way to the device path.
    assert fused_moe.capturable_config({"path": "host"}, 512, 128, 8, torch.float32)["path"] == "gemv"
    assert fused_moe.capturable_config({"path": "host"}, 4, 128, 8, torch.float16) == {"path": "gemm",
                                                                                         "block_size": 16}
    tuned = {"path": "gemv", "rows_per_block": 4}
    assert fused_moe.capturable_config(tuned, 512, 128, 8, torch.float16) is tuned
    with pytest.raises(ValueError, match=r"'path' must be one of \('gemv', 'gemm', 'host'\), got 'x'"):
        fused_moe.check_config({"path": "x"}, torch.float16)
    with pytest.raises(ValueError, match=r"'block_size' must be one of \(16, 32, 64\), got 48"):
        fused_moe.check_config({"path": "gemm", "block_size": 48}, torch.float16)
    with pytest.raises(ValueError, match="'gemm' needs float16 or bfloat16"):
        fused_moe.check_config({"path": "gemm", "block_size": 16}, torch.float32)


def test_cpu_layers_keep_the_host_path_and_no_graphs():
    moe = MoE(4, 2, 16, 8, True)
    assert moe.device_path_reason() == "the weights are not on a CUDA device"
    assert not supports_cuda_graphs(torch.nn.Sequential(moe))


def _moe(e, k, hidden, inter, dtype, renormalize=True, seed=0, hidden_act="silu"):
    g = torch.Generator().manual_seed(seed)
    moe = MoE(e, k, hidden, inter, renormalize, hidden_act).to(dtype)
    moe.gate.weight.data.copy_(torch.randn(e, hidden, generator=g))
    moe.w13.data.copy_(torch.randn(e, 2 * inter, hidden, generator=g) / hidden ** 0.5)
    moe.w2.data.copy_(torch.randn(e, hidden, inter, generator=g) / inter ** 0.5)
    return moe.cuda()


def _reference(moe, x):
    """float64, routed from the layer's own ids (near-ties in the router may differ by dtype)."""
    ids, weights = moe.route(x)
    inter = moe.intermediate
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in ids.unique().tolist():  # per expert: no [T, k, N, K] gather of the weights
        t, j = (ids == e).nonzero(as_tuple=True)
        h = x[t].double() @ moe.w13[e].double().t()
        gate = F.silu(h[:, :inter]) if moe.hidden_act == "silu" else F.gelu(h[:, :inter], approximate="tanh")
        y = (gate * h[:, inter:]) @ moe.w2[e].double().t()
        out.index_add_(0, t, y * weights[t, j].double()[:, None])
    return out


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 8, 9, 64, 300])
@pytest.mark.parametrize("e,k,hidden,inter,act", [(8, 2, 256, 512, "silu"), (60, 4, 128, 72, "silu"),
                                                   (128, 8, 512, 96, "silu"), (16, 4, 256, 64, "gelu_pytorch_tanh")])
def test_device_path_matches_float64_and_the_host_path(dtype, tokens, e, k, hidden, inter, act):
    skip_unsupported("cuda", dtype)  # bfloat16: an SM80+ GPU and a build with BF16 kernels
    moe = _moe(e, k, hidden, inter, dtype, hidden_act=act)
    assert moe.device_path_reason() is None
    x = torch.randn(tokens, hidden, device="cuda").to(dtype)
    out = moe(x)
    tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double(), _reference(moe, x), atol=tol, rtol=tol)
    ids, weights = moe.route(x)
    host = moe._forward_host_grouped(x, ids, weights.to(dtype))
    torch.testing.assert_close(out.double(), host.double(), atol=2 * tol, rtol=2 * tol)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [4, 40])  # decode GEMVs; grouped GEMM
def test_layer_replays_in_a_cuda_graph_with_padded_rows(tokens):
    moe = _moe(16, 4, 256, 64, torch.float16, seed=1)
    assert supports_cuda_graphs(torch.nn.Sequential(moe))
    static_x = torch.zeros(tokens, 256, dtype=torch.float16, device="cuda")
    moe(static_x)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = moe(static_x)
    for real in (tokens, tokens - 1, 1):
        x = torch.randn(real, 256, device="cuda").half()
        static_x[:real].copy_(x)
        static_x[real:] = float("nan")  # padded rows: stale or garbage, their outputs are dropped
        graph.replay()
        torch.testing.assert_close(static_out[:real].double(), _reference(moe, x), atol=4e-3, rtol=4e-3)


@requires_gpu
@pytest.mark.gpu
def test_exact_gelu_keeps_the_host_path():
    moe = MoE(4, 2, 64, 32, True, hidden_act="gelu").half().cuda()
    assert "hidden_act" in moe.device_path_reason()
    assert not supports_cuda_graphs(torch.nn.Sequential(moe))


def test_tuned_config_file_is_what_the_layer_reads(tmp_path, monkeypatch):
    from vllm_volta.kernel_configs import clear_kernel_config_cache, write_kernel_config
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    moe = MoE(16, 4, 64, 32, True)
    moe._kernel_device = "Test GPU 80GB"  # as torch.cuda.get_device_name would name it
    # What benchmark_moe.py --tune writes: the layer's shape keys, batch size -> launch params.
    write_kernel_config("fused_moe", {1: {"path": "gemv", "rows_per_block": 2},
                                      64: {"path": "gemm", "block_size": 64}},
                        device_name="Test GPU 80GB", **moe.kernel_config_shape(torch.float16))
    try:
        assert moe._kernel_config(2, torch.float16) == {"path": "gemv", "rows_per_block": 2}
        assert moe._kernel_config(100, torch.float16) == {"path": "gemm", "block_size": 64}
        # No file for float32: the defaults.
        assert moe._kernel_config(100, torch.float32) == fused_moe.default_config(100, 16, 4, torch.float32)
        write_kernel_config("fused_moe", {1: {"path": "gemm", "block_size": 48}}, device_name="Test GPU 80GB",
                            **moe.kernel_config_shape(torch.float16))
        with pytest.raises(ValueError, match=r"'block_size' must be one of \(16, 32, 64\), got 48"):
            moe._kernel_config(1, torch.float16)
    finally:
        clear_kernel_config_cache()
