"""DriverGraph: graphs captured with the CUDA driver API replay like eager execution."""
from __future__ import annotations

import gc

import pytest
import torch

from vllm_volta.worker import driver_graph
from vllm_volta.worker.driver_graph import DriverGraph, capture_graph, driver_graphs_available

needs_driver_graphs = pytest.mark.skipif(not driver_graphs_available(),
                                         reason="needs a CUDA GPU, libcuda and torch.cuda.MemPool")


def test_unavailable_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not driver_graphs_available()


def test_unavailable_without_libcuda(monkeypatch):
    monkeypatch.setattr(driver_graph, "_libcuda", lambda: None)
    assert not driver_graphs_available()


def test_capture_path_follows_the_variable_then_availability(clean_env, monkeypatch):
    monkeypatch.setattr(driver_graph, "driver_graphs_available", lambda: True)
    assert driver_graph.choose_capture_path() == (True, "CUDA driver API")
    clean_env.setenv("VLLM_VOLTA_CUDA_GRAPH_CAPTURE", "torch")
    use_driver, why = driver_graph.choose_capture_path()
    assert not use_driver and "VLLM_VOLTA_CUDA_GRAPH_CAPTURE=torch" in why
    clean_env.setenv("VLLM_VOLTA_CUDA_GRAPH_CAPTURE", "driver")
    monkeypatch.setattr(driver_graph, "driver_graphs_available", lambda: False)
    use_driver, why = driver_graph.choose_capture_path()
    assert not use_driver and "no libcuda or torch.cuda.MemPool" in why


def work(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # Intermediates are allocated (and freed) during the capture: they live in the pool.
    h = torch.relu(x @ w) * 2.0 + 1.0
    return (h @ w.t()).tanh() + x


@pytest.mark.gpu
@needs_driver_graphs
def test_replay_equals_eager_for_new_inputs_and_survives_other_allocations():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    w = torch.randn(64, 64, device=dev) / 8
    pool = torch.cuda.MemPool()
    inputs = {rows: torch.randn(rows, 64, device=dev) for rows in (1, 8, 32)}
    graphs, outputs = {}, {}
    for rows, x in inputs.items():
        graphs[rows], outputs[rows], _ = capture_graph(lambda: work(x, w), True, pool)
    # Captured largest last here, so the pool holds every graph's intermediates; a second
    # capture of the 32-row work reuses the blocks the first one freed (one capture stream).
    before = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    again = DriverGraph()
    with again.capture(pool):
        work(inputs[32], w)
    assert torch.cuda.memory_reserved() == reserved and torch.cuda.memory_allocated() == before
    # Memory churn outside the pool must not reuse the graphs' blocks.
    junk = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(8)]
    del junk
    torch.cuda.empty_cache()
    for step in range(3):
        for rows, x in inputs.items():
            x.copy_(torch.randn(rows, 64, device=dev))
            graphs[rows].replay()
            torch.testing.assert_close(outputs[rows], work(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@needs_driver_graphs
def test_a_graph_keeps_its_pool_and_the_blocks_it_replays_into_alive():
    # The caller drops its reference to the pool right after the capture (the kernel
    # benchmarks' timing did): the intermediates' blocks must not go back to the device or to
    # other tensors while the graph can replay.
    torch.manual_seed(0)
    dev = torch.device("cuda")
    w = torch.randn(256, 256, device=dev) / 16
    x = torch.randn(512, 256, device=dev)
    pool = torch.cuda.MemPool()
    graph, out, _ = capture_graph(lambda: work(x, w), True, pool)
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    junk = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(16)]
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, work(x, w), rtol=1e-5, atol=1e-5)
    assert all(bool((j == 7.0).all()) for j in junk)


@pytest.mark.gpu
@needs_driver_graphs
def test_a_failed_capture_raises_and_leaves_the_stream_usable():
    dev = torch.device("cuda")
    pool = torch.cuda.MemPool()
    x = torch.ones(16, device=dev)
    graph = DriverGraph()
    with pytest.raises(ValueError, match="inside the capture"):
        with graph.capture(pool):
            x.add_(1)
            raise ValueError("inside the capture")
    with pytest.raises(RuntimeError, match="before a graph was captured"):
        graph.replay()
    with graph.capture(pool):  # the same object captures fine afterwards
        x.mul_(3)
    with pytest.raises(RuntimeError, match="already holds"):
        with graph.capture(pool):
            pass
    x.fill_(1)
    graph.replay()
    graph.replay()
    assert torch.equal(x, torch.full_like(x, 9.0))  # the failed capture's add never ran


def test_a_driver_error_names_the_call_the_error_and_the_ways_around_it(monkeypatch):
    class FakeLib:
        @staticmethod
        def cuGetErrorName(result, name_ptr):
            name_ptr._obj.value = b"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
            return 0

    monkeypatch.setattr(driver_graph, "_libcuda", lambda: FakeLib())
    driver_graph._check(0, "cuGraphLaunch")  # success: nothing raised
    with pytest.raises(RuntimeError) as info:
        driver_graph._check(900, "cuStreamBeginCapture")
    message = str(info.value)
    assert "cuStreamBeginCapture failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (CUresult 900)" in message
    assert "VLLM_VOLTA_CUDA_GRAPH_CAPTURE=torch" in message and "enforce_eager=True" in message
