"""CUDA graphs captured through the CUDA driver API instead of ``torch.cuda.CUDAGraph``.

Why: on the H200 this project measures on (torch 2.11.0+cu130, driver 580), once a process has
captured four graphs through ``torch.cuda.CUDAGraph``, every graph of the process replays each
kernel node about 0.45 us slower (one graph of 288 small kernels: 0.685 -> 0.818 ms of GPU time;
more captures, other capture modes, destroying the graphs or never instantiating them change
nothing). The same work captured with ``cuStreamBeginCapture`` / ``cuStreamEndCapture`` /
``cuGraphInstantiate`` replays at 0.693 ms with 13 graphs. The engine captures one decode graph
per batch size (up to 83) of ~200 kernels each, so this is the default capture path
(``VLLM_VOLTA_CUDA_GRAPH_CAPTURE=torch`` selects torch's).

Memory the captured work allocates comes from a ``torch.cuda.MemPool`` (what torch's graphs
do with their private pool): each graph holds a reference to its pool, whose blocks it reads
and writes at every replay, so the pool lives as long as any graph captured into it. Every
capture runs on one side stream per device, as torch's do: the caching allocator reuses a
freed block only on the stream it was allocated on, so graphs sharing a pool (captured
largest first) reuse each other's memory. A capture uses relaxed mode, so that the caching
allocator may grow the pool (``cudaMalloc``) during it.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import weakref
from typing import Any, Callable, Iterator

import torch

_CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED


@functools.cache
def _libcuda() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    handle, ptr = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "cuStreamBeginCapture_v2": [handle, ctypes.c_int],
        "cuStreamEndCapture": [handle, ptr],
        "cuGraphInstantiateWithFlags": [ptr, handle, ctypes.c_ulonglong],
        "cuGraphLaunch": [handle, handle],
        "cuGraphDestroy": [handle],
        "cuGraphExecDestroy": [handle],
        "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name, None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


def driver_graphs_available() -> bool:
    """True when graphs can be captured here with the driver API (a CUDA device, libcuda with
    the graph calls, and torch's MemPool to route the captured work's allocations)."""
    return (torch.cuda.is_available() and hasattr(torch.cuda, "MemPool")
            and hasattr(torch.cuda, "use_mem_pool") and _libcuda() is not None)


def choose_capture_path() -> tuple[bool, str]:
    """(capture with the driver API?, why), for the engine's graphs and the kernel benchmarks':
    VLLM_VOLTA_CUDA_GRAPH_CAPTURE first, then whether the driver path is available."""
    from vllm_volta import envs

    if envs.VLLM_VOLTA_CUDA_GRAPH_CAPTURE == "torch":
        return False, "torch.cuda.CUDAGraph, as VLLM_VOLTA_CUDA_GRAPH_CAPTURE=torch asks"
    if driver_graphs_available():
        return True, "CUDA driver API"
    return False, "torch.cuda.CUDAGraph: no libcuda or torch.cuda.MemPool for the driver API"


@functools.cache
def _capture_stream(device: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def _check(result: int, call: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _libcuda().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {(name.value or b'?').decode()} (CUresult {result}); "
                           "VLLM_VOLTA_CUDA_GRAPH_CAPTURE=torch captures with torch.cuda.CUDAGraph "
                           "instead, enforce_eager=True runs without CUDA graphs")


class DriverGraph:
    """One captured graph: ``with graph.capture(pool): out = fn(...)``, then ``graph.replay()``
    on the current stream (the same contract as torch.cuda.CUDAGraph: replays read and write
    the tensors the captured work used)."""

    def __init__(self) -> None:
        self._exec: ctypes.c_void_p | None = None
        self._pool: torch.cuda.MemPool | None = None

    @contextlib.contextmanager
    def capture(self, pool: torch.cuda.MemPool) -> Iterator[None]:
        if self._exec is not None:
            raise RuntimeError("this DriverGraph already holds a captured graph")
        lib = _libcuda()
        stream = _capture_stream(torch.cuda.current_device())
        stream.wait_stream(torch.cuda.current_stream())
        handle = ctypes.c_void_p(stream.cuda_stream)
        graph = ctypes.c_void_p()
        with torch.cuda.stream(stream), torch.cuda.use_mem_pool(pool):
            _check(lib.cuStreamBeginCapture_v2(handle, _CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
            try:
                yield
            except BaseException:
                if lib.cuStreamEndCapture(handle, ctypes.byref(graph)) == 0 and graph:
                    lib.cuGraphDestroy(graph)
                raise
            _check(lib.cuStreamEndCapture(handle, ctypes.byref(graph)), "cuStreamEndCapture")
        try:
            graph_exec = ctypes.c_void_p()
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(graph_exec), graph, 0), "cuGraphInstantiate")
        finally:
            lib.cuGraphDestroy(graph)
        self._exec = graph_exec
        self._pool = pool  # replays use the blocks the captured work allocated from it
        weakref.finalize(self, lib.cuGraphExecDestroy, graph_exec)  # also runs at exit, before teardown
        torch.cuda.current_stream().wait_stream(stream)

    def replay(self) -> None:
        if self._exec is None:
            raise RuntimeError("replay() before a graph was captured")
        _check(_libcuda().cuGraphLaunch(self._exec, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)),
               "cuGraphLaunch")


def new_capture(use_driver: bool, pool: Any = None) -> tuple[Any, Any, Any]:
    """(graph, the context manager that captures into it, pool): a DriverGraph allocating from
    ``pool`` (a torch.cuda.MemPool, made when None) or a torch.cuda.CUDAGraph sharing ``pool`` (a
    graph pool handle; None: the graph's own, ``graph.pool()`` once captured)."""
    if use_driver:
        pool = torch.cuda.MemPool() if pool is None else pool
        graph = DriverGraph()
        return graph, graph.capture(pool), pool
    graph = torch.cuda.CUDAGraph()
    return graph, torch.cuda.graph(graph, pool=pool), pool


def capture_graph(work: Callable[[], Any], use_driver: bool, pool: Any = None) -> tuple[Any, Any, Any]:
    """One graph of work()'s launches on the current device: a DriverGraph allocating from
    ``pool`` (a torch.cuda.MemPool, made when None) or a torch.cuda.CUDAGraph sharing ``pool`` (a
    graph pool handle; a private pool when None). work() first runs once outside the capture,
    for lazy initialisation (library handles, autotuning, first kernel loads).
    Returns (graph, work()'s output, the pool a later capture shares)."""
    work()
    torch.cuda.synchronize()
    graph, capture, pool = new_capture(use_driver, pool)
    with capture:
        out = work()
    return graph, out, graph.pool() if pool is None else pool
