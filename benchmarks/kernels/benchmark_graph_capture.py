"""Replay cost of a CUDA graph by capture path: torch.cuda.CUDAGraph or the CUDA driver API.

    python benchmarks/kernels/benchmark_graph_capture.py --num-graphs 13

Each path runs in its own process, since what is measured lasts for the process. One graph of
--layers x 10 small ops (a [1, H] x [H, H] fp16 linear and nine elementwise ops, H = --hidden)
is captured and its replays timed (GPU time between CUDA events, median of --replays); then
--num-graphs - 1 more graphs of the same work are captured and the first graph is timed again.
On the H200 with torch 2.11, torch's replays get ~0.45 us slower per kernel from the fourth
capture of a process on; the driver API's (vllm_volta/worker/driver_graph.py, the engine's
default) do not. Prints JSON: ms per replay of the first graph before and after, per path,
and torch's / the driver's time after.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.utils import device_info, log, ratio, require_cuda, run_and_emit  # noqa: E402

PATHS = ("torch", "driver")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-graphs", type=int, default=13, help="graphs captured in all")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--path", choices=PATHS, default=None,
                        help="measure one capture path in this process (the parent runs both)")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    for name in ("num_graphs", "layers", "hidden", "replays"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def make_work(layers: int, hidden: int, device: torch.device) -> Callable[[], torch.Tensor]:
    torch.manual_seed(0)
    weights = [torch.randn(hidden, hidden, dtype=torch.half, device=device) * 0.01 for _ in range(8)]
    x = torch.randn(1, hidden, dtype=torch.half, device=device)

    def work() -> torch.Tensor:
        y = x
        for i in range(layers):
            y = F.linear(y, weights[i % 8])
            y = ((y * 0.5 + 1.0).relu().tanh() + x) * 0.9
            y = (y - 0.1).abs().clamp(max=2.0)
        return y

    return work


def replay_ms(graph: Any, replays: int) -> float:
    times = []
    for i in range(replays + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_path(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_graph_capture.py")
    from vllm_volta.worker.driver_graph import capture_graph, driver_graphs_available

    if args.path == "driver" and not driver_graphs_available():
        raise RuntimeError("the driver capture path needs libcuda and torch.cuda.MemPool")
    use_driver = args.path == "driver"
    work = make_work(args.layers, args.hidden, device)
    first, _, pool = capture_graph(work, use_driver)
    alone = replay_ms(first, args.replays)
    # The driver path's graphs share one pool, as the engine's do; torch's each get a private one.
    others = [capture_graph(work, use_driver, pool if use_driver else None)[0]
              for _ in range(args.num_graphs - 1)]
    after = replay_ms(first, args.replays)
    log(f"{args.path}: {alone:.3f} ms per replay alone, {after:.3f} ms with {len(others) + 1} graphs")
    return {"path": args.path, "num_graphs": args.num_graphs, "layers": args.layers,
            "ms_per_replay_alone": alone, "ms_per_replay_after": after, "after_vs_alone": after / alone}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.path is not None:
        return run_path(args)
    results = {}
    for path in PATHS:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--num-graphs", str(args.num_graphs),
               "--layers", str(args.layers), "--hidden", str(args.hidden), "--replays", str(args.replays),
               "--path", path]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the {path} run failed (exit {proc.returncode}); its stderr is above")
        results[path] = json.loads(proc.stdout)
    return {"benchmark": "kernels/graph_capture", "device_info": device_info(), "results": results,
            "torch_vs_driver_after": ratio(results["torch"]["ms_per_replay_after"],
                                           results["driver"]["ms_per_replay_after"])}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
