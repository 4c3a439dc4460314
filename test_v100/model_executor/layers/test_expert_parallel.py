"""Expert parallelism: vLLM's linear placement against tables written out by hand, the MoE layer's
per-rank experts (only its own loaded, their shares summing to the one-rank output) on the
PyTorch path, bad configurations, and on a GPU the device path (decode GEMVs, grouped GEMM) with
an expert map against a float64 reference."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.logger import ROOT_LOGGER_NAME
from vllm_volta.model_executor.layers import fused_moe
from vllm_volta.model_executor.layers.expert_parallel import (expert_parallel, expert_parallel_enabled,
                                                              linear_placement)
from vllm_volta.model_executor.layers.moe import MoE

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (num_experts, ep_size) -> each rank's experts, by hand: the first num_experts % ep_size ranks
# hold one more, in order.
TABLES = {
    (8, 2): [[0, 1, 2, 3], [4, 5, 6, 7]],
    (6, 2): [[0, 1, 2], [3, 4, 5]],
    (10, 4): [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]],
    (7, 3): [[0, 1, 2], [3, 4], [5, 6]],
    (4, 4): [[0], [1], [2], [3]],
    (60, 8): [list(range(0, 8)), list(range(8, 16)), list(range(16, 24)), list(range(24, 32)),
              list(range(32, 39)), list(range(39, 46)), list(range(46, 53)), list(range(53, 60))],
}


@pytest.mark.parametrize("num_experts,ep_size", list(TABLES))
def test_linear_placement_matches_the_table(num_experts, ep_size):
    for rank, experts in enumerate(TABLES[(num_experts, ep_size)]):
        p = linear_placement(num_experts, ep_size, rank)
        assert (p.start, p.num_local) == (experts[0], len(experts))
        expected_map = [experts.index(e) if e in experts else -1 for e in range(num_experts)]
        assert p.expert_map().tolist() == expected_map and p.expert_map().dtype == torch.int32
        assert [p.local_index(e) for e in range(num_experts)] == [i if i >= 0 else None for i in expected_map]


def test_placement_errors():
    with pytest.raises(ValueError, match=r"enable_expert_parallel: num_experts \(3\) must be at least the expert "
                                         r"parallel size \(tensor_parallel_size=4\)"):
        linear_placement(3, 4, 0)
    with pytest.raises(ValueError, match=r"expert parallel rank must be an integer in \[0, 1\], got 2"):
        linear_placement(8, 2, 2)
    with pytest.raises(ValueError, match="expert parallel size must be an integer >= 1, got 0"):
        linear_placement(8, 0, 0)


def test_the_flag_reaches_the_parallel_config_from_the_server_cli():
    import argparse

    from vllm_volta.config import ParallelConfig
    from vllm_volta.engine.arg_utils import EngineArgs
    from vllm_volta.entrypoints.openai.cli_args import add_server_args, build_engine_args
    args = add_server_args(argparse.ArgumentParser()).parse_args(["--enable-expert-parallel",
                                                                  "--tensor-parallel-size", "2"])
    engine_args = build_engine_args(args)
    assert engine_args.enable_expert_parallel is True and EngineArgs().enable_expert_parallel is False
    assert ParallelConfig(2, enable_expert_parallel=True).enable_expert_parallel
    with pytest.raises(ValueError, match="enable_expert_parallel must be True or False, got 'yes'"):
        ParallelConfig(2, enable_expert_parallel="yes")


def _random_experts(num_experts: int, hidden: int, inter: int, seed: int = 0):
    """Per-expert checkpoint tensors (gate [I, H], up [I, H], down [H, I]) and router weight."""
    g = torch.Generator().manual_seed(seed)
    experts = [{part: torch.randn(*shape, generator=g) * 0.2
                for part, shape in (("gate", (inter, hidden)), ("up", (inter, hidden)), ("down", (hidden, inter)))}
               for _ in range(num_experts)]
    return experts, torch.randn(num_experts, hidden, generator=g)


def _build_moe(experts, router, top_k: int, hidden: int, inter: int, act: str = "silu") -> MoE:
    moe = MoE(len(experts), top_k, hidden, inter, renormalize=True, hidden_act=act)
    moe.gate.weight.data.copy_(router)
    for e, parts in enumerate(experts):
        for part, tensor in parts.items():
            moe.load_expert(e, part, tensor)
    return moe


@pytest.mark.parametrize("num_experts,ep_size", [(6, 2), (7, 3)])
def test_each_rank_holds_and_loads_only_its_experts(set_tp, num_experts, ep_size):
    hidden, inter, top_k = 16, 24, 2
    experts, router = _random_experts(num_experts, hidden, inter)
    x = torch.randn(11, hidden, generator=torch.Generator().manual_seed(1))
    full = _build_moe(experts, router, top_k, hidden, inter)
    expected = full(x)
    total = torch.zeros_like(expected)
    for rank in range(ep_size):
        set_tp(rank, ep_size)
        with expert_parallel(True):
            assert expert_parallel_enabled()
            moe = _build_moe(experts, router, top_k, hidden, inter)
        held = TABLES[(num_experts, ep_size)][rank]
        # Whole experts (intermediate not split), only this rank's, and exactly their weights.
        assert moe.w13.shape == (len(held), 2 * inter, hidden) and moe.w2.shape == (len(held), hidden, inter)
        assert moe.w13.nbytes + moe.w2.nbytes == len(held) * 3 * inter * hidden * 4
        for local, e in enumerate(held):
            torch.testing.assert_close(moe.w13[local], torch.cat([experts[e]["gate"], experts[e]["up"]]))
            torch.testing.assert_close(moe.w2[local], experts[e]["down"])
        assert moe.gate.weight.shape == (num_experts, hidden)  # the router stays whole (global routing)
        total += moe.forward_local(x)
    assert not expert_parallel_enabled()
    torch.testing.assert_close(total, expected, atol=1e-5, rtol=1e-5)


def test_tensor_parallel_shares_also_sum_to_the_output(set_tp):
    """Without the flag each rank holds a slice of every expert; forward_local's shares still sum."""
    hidden, inter = 16, 24
    experts, router = _random_experts(4, hidden, inter, seed=3)
    x = torch.randn(5, hidden, generator=torch.Generator().manual_seed(4))
    expected = _build_moe(experts, router, 2, hidden, inter)(x)
    total = torch.zeros_like(expected)
    for rank in range(2):
        set_tp(rank, 2)
        moe = _build_moe(experts, router, 2, hidden, inter)
        assert moe.w13.shape == (4, inter, hidden) and moe.expert_map is None
        total += moe.forward_local(x)
    torch.testing.assert_close(total, expected, atol=1e-5, rtol=1e-5)


def test_too_few_experts_for_the_ranks_is_refused(set_tp):
    set_tp(1, 4)
    with expert_parallel(True), pytest.raises(ValueError, match=r"enable_expert_parallel: num_experts \(2\)"):
        MoE(2, 1, 16, 24, renormalize=True)
    assert not expert_parallel_enabled()  # the scope closed on the error


def test_one_rank_keeps_every_expert(set_tp):
    with expert_parallel(True):
        moe = MoE(4, 2, 16, 24, renormalize=True)
    assert moe.w13.shape[0] == 4 and moe.expert_map is None


def test_a_model_without_experts_logs_that_the_flag_does_nothing(caplog):
    root = logging.getLogger(ROOT_LOGGER_NAME)
    root.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=ROOT_LOGGER_NAME), expert_parallel(True):
            torch.nn.Linear(4, 4)
        with caplog.at_level(logging.INFO, logger=ROOT_LOGGER_NAME), expert_parallel(True):
            MoE(4, 2, 16, 24, renormalize=True)
    finally:
        root.removeHandler(caplog.handler)
    assert caplog.text.count("enable_expert_parallel has no effect: the model has no mixture-of-experts layers") == 1


def test_align_reference_leaves_other_ranks_pairs_out():
    from vllm_volta.model_executor.layers.moe_routing import align_reference
    ids = torch.tensor([[0, -1], [-1, 1], [1, 0], [-1, -1]], dtype=torch.int32)
    sorted_ids, experts_ids, total = align_reference(ids, 2, 2)
    # Pairs of expert 0: 0, 5; of expert 1: 3, 4 (pair p = t * 2 + j); padding id 8.
    assert int(total) == 4 and sorted_ids[:4].tolist() == [0, 5, 3, 4]
    assert (sorted_ids[4:] == 8).all() and len(sorted_ids) == 8 + 2 * 1
    assert experts_ids.tolist()[:2] == [0, 1] and (experts_ids[2:] == -1).all()


def test_expert_parallel_config_prefers_the_grouped_gemm():
    """GEMVs would re-read a local expert for every other rank's pair: 16-bit batches take the
    grouped GEMM, float32 (no tensor-core path) and the other paths are kept."""
    gemv = {"path": "gemv", "rows_per_block": 4}
    assert fused_moe.expert_parallel_config(gemv, torch.float16) == {"path": "gemm", "block_size": 16}
    assert fused_moe.expert_parallel_config(gemv, torch.bfloat16) == {"path": "gemm", "block_size": 16}
    assert fused_moe.expert_parallel_config(gemv, torch.float32) is gemv
    for kept in ({"path": "gemm", "block_size": 64}, {"path": "host"}):
        assert fused_moe.expert_parallel_config(kept, torch.float16) is kept


def _reference_local(x, experts, held, ids, weights, act):
    """float64 sum over each token's chosen experts that this rank holds."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    fn = (lambda g: F.silu(g)) if act == "silu" else (lambda g: F.gelu(g, approximate="tanh"))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e not in held:
                continue
            p = {k: v.double() for k, v in experts[e].items()}
            h = fn(x[t].double() @ p["gate"].t()) * (x[t].double() @ p["up"].t())
            out[t] += float(weights[t, j]) * (h @ p["down"].t())
    return out


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [3, 40])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_device_path_with_an_expert_map(dtype, tokens, act):
    """fused_experts on one rank's experts with the expert map, gemv and (16-bit) grouped GEMM,
    against float64 over the same rank's experts; the ranks' shares sum to the whole."""
    from vllm_volta import _custom_ops as ops
    if not ops.has_cuda_kernel("moe_gemv_silu_and_mul"):
        pytest.skip("this build has no CUDA mixture-of-experts kernels")
    num_experts, ep_size, hidden, inter, top_k = 10, 4, 64, 96, 3
    experts, _ = _random_experts(num_experts, hidden, inter, seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(tokens, hidden, generator=g)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, top_k, generator=g)
    paths = [{"path": "gemv", "rows_per_block": 0}]
    if dtype != torch.float32:
        paths.append({"path": "gemm", "block_size": 16})
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for config in paths:
        total = torch.zeros(tokens, hidden, dtype=torch.float64)
        for rank in range(ep_size):
            p = linear_placement(num_experts, ep_size, rank)
            held = list(range(p.start, p.start + p.num_local))
            w13 = torch.stack([torch.cat([experts[e]["gate"], experts[e]["up"]]) for e in held])
            w2 = torch.stack([experts[e]["down"] for e in held])
            out = fused_moe.fused_experts(x.to("cuda", dtype), w13.to("cuda", dtype).contiguous(),
                                          w2.to("cuda", dtype).contiguous(), weights.cuda(), ids.cuda(), config,
                                          act, p.expert_map("cuda"))
            ref = _reference_local(x.to(dtype).float(), experts, held, ids, weights, act)
            torch.testing.assert_close(out.double().cpu(), ref, **tol)
            total += out.double().cpu()
        everything = _reference_local(x.to(dtype).float(), experts, list(range(num_experts)), ids, weights, act)
        torch.testing.assert_close(total, everything, **tol)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [2, 33])
def test_moe_layer_on_the_device_matches_the_host_path_per_rank(set_tp, tokens):
    """The MoE layer of each EP rank on CUDA (device path: the grouped GEMM at every size) against
    the same rank on the CPU (host-grouped PyTorch path), float16 weights, on the same routing
    (float16 router logits could flip a near tie)."""
    from vllm_volta import _custom_ops as ops
    if not ops.has_cuda_kernel("moe_gemv_silu_and_mul"):
        pytest.skip("this build has no CUDA mixture-of-experts kernels")
    hidden, inter, num_experts = 64, 96, 6
    experts, router = _random_experts(num_experts, hidden, inter, seed=7)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(8)).half().float()
    for rank in range(2):
        set_tp(rank, 2)
        with expert_parallel(True):
            host = _build_moe(experts, router, 2, hidden, inter).half()
        with expert_parallel(True), torch.device("cuda"):
            device = MoE(num_experts, 2, hidden, inter, renormalize=True)
        device.load_state_dict(host.state_dict())
        device.half()
        assert device.device_path_reason() is None and device.expert_map.is_cuda
        host.float()
        ids, weights = host.route(x)
        host.route = lambda _, routed=(ids, weights): routed
        device.route = lambda _, routed=(ids.cuda(), weights.cuda()): routed
        expected = host.forward_local(x)
        got = device.forward_local(x.half().cuda())
        torch.testing.assert_close(got.float().cpu(), expected, atol=2e-2, rtol=2e-2)
