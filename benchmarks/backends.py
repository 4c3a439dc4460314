"""Which backends an offline benchmark runs, in which order, on which dtype.

vllm-volta runs first and is torn down before transformers runs, so each has the device to
itself (the engine sizes its KV cache from free memory). The transformers reference reuses
the dtype the engine resolved, so both sides compute in the same precision.
"""
from __future__ import annotations

import argparse
from typing import Any, Iterator

import torch

from benchmarks.cli_args import engine_kwargs
from benchmarks.utils import default_device, device_info, parse_dtype


def standalone_hf_dtype(dtype_flag: str, hf_config: Any) -> torch.dtype:
    """--dtype for a transformers-only run, resolved by the platform exactly as the engine
    resolves it ('auto' = the config's dtype, fp16 instead of bf16 below SM80, ...)."""
    from vllm_volta.platforms import current_platform

    config_dtype = getattr(hf_config, "dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = parse_dtype(config_dtype)
    return current_platform.resolve_dtype(dtype_flag, config_dtype)


def iter_runners(args: argparse.Namespace, hf_config: Any,
                 hf_batch_size: int) -> Iterator[Any]:
    """Yield the runners the flags ask for (ours first), closing each after its turn."""
    dtype = None
    if args.backend == "vllm-volta":
        from benchmarks.engine_runner import EngineRunner

        runner = EngineRunner(engine_kwargs(args), temperature=args.temperature)
        dtype = runner.dtype
        try:
            yield runner
        finally:
            runner.close()
    if args.backend == "hf" or args.compare_hf:
        from benchmarks.hf_reference import HFRunner

        if dtype is None:
            dtype = standalone_hf_dtype(args.dtype, hf_config)
        runner = HFRunner(args.model, dtype=dtype, device=default_device(),
                          load_format=args.load_format, seed=args.seed,
                          batch_size=hf_batch_size, temperature=args.temperature)
        try:
            yield runner
        finally:
            runner.close()


def offline_result(benchmark: str, args: argparse.Namespace, results: dict[str, dict[str, Any]],
                   **workload: Any) -> dict[str, Any]:
    """The JSON document of an offline benchmark: the primary backend's figures at top level
    (vLLM's field names), every backend's under "results", then device and flags."""
    return {"benchmark": benchmark, "backend": args.backend, "model": args.model,
            "load_format": args.load_format, **workload, **results[args.backend],
            "results": results, "device": device_info(), "args": vars(args)}
