"""Batch-1 decode of a GGUF model kept in its blocks against the same shape in float16.

    python benchmarks/benchmark_gguf_decode.py --config llama-3-8b --quant Q4_K_M
    python benchmarks/benchmark_gguf_decode.py --gguf /path/model.gguf --config llama-3-8b

Writes a random-weight GGUF file of ``--config`` (make_gguf_model.py: llama.cpp's Q4_K_M type
choice) unless ``--gguf`` names one, runs it in float16 (linear layers in their GGUF blocks:
gguf_gemv at decode), then ``--config`` with random float16 weights (load format dummy), each in
its own engine, one after the other. Decode time per token: (time for ``--output-len`` tokens -
time for one token) / (output_len - 1), medians over ``--num-iters``. Prints one JSON document with
both and the speedup (the target on an H200: Q4_K_M at least 2x float16).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import torch  # noqa: E402

from benchmarks.make_gguf_model import QUANTS, write_model  # noqa: E402
from benchmarks.utils import (device_info, log, random_token_prompts, require_cuda, resolve_model,  # noqa: E402
                              run_and_emit, timed)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="llama-3-8b", help="shipped llama config (the float16 baseline's shape)")
    p.add_argument("--gguf", default=None, help="an existing GGUF file of that shape (else one is written)")
    p.add_argument("--quant", default="Q4_K_M", choices=QUANTS, help="the written file's quantization")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    for name in ("input_len", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.output_len < 2:
        raise ValueError(f"--output-len must be >= 2, got {args.output_len}")
    return args


def decode_seconds_per_token(args: argparse.Namespace, vocab: int, dtype: str = "float16",
                             **engine: Any) -> dict[str, Any]:
    """Median decode seconds per token of one engine at batch 1 (its prefill subtracted)."""
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams

    llm = LLM(skip_tokenizer_init=True, dtype=dtype, gpu_memory_utilization=args.gpu_memory_utilization,
              enforce_eager=args.enforce_eager, **engine)
    full = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(random_token_prompts(1, args.input_len, vocab, seed=99), full, use_tqdm=False)  # warm-up
    per_token = []
    for i in range(args.num_iters):
        prompt = random_token_prompts(1, args.input_len, vocab, seed=i)
        with timed() as prefill:
            llm.generate(prompt, first, use_tqdm=False)
        with timed() as whole:
            llm.generate(random_token_prompts(1, args.input_len, vocab, seed=1000 + i), full, use_tqdm=False)
        per_token.append((whole["elapsed"] - prefill["elapsed"]) / (args.output_len - 1))
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"median_s_per_token": statistics.median(per_token), "s_per_token": per_token}


def run(args: argparse.Namespace) -> dict[str, Any]:
    require_cuda("benchmark_gguf_decode.py")
    config_dir = Path(resolve_model(None, args.config))
    config = json.loads((config_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.gguf) if args.gguf else Path(tmp) / f"{args.config}-{args.quant}.gguf"
        counts = None
        if args.gguf is None:
            counts = write_model(config, args.quant, path)
            log(f"wrote {path.name}: {path.stat().st_size / 2**30:.2f} GiB, tensors by type {counts}")
        gguf = decode_seconds_per_token(args, config["vocab_size"], model=str(path))
    dense = decode_seconds_per_token(args, config["vocab_size"], model=str(config_dir), load_format="dummy")
    speedup = dense["median_s_per_token"] / gguf["median_s_per_token"]
    log(f"decode per token: GGUF {gguf['median_s_per_token'] * 1e3:.2f} ms, float16 "
        f"{dense['median_s_per_token'] * 1e3:.2f} ms: {speedup:.2f}x")
    return {"benchmark": "gguf_decode", "config": args.config, "quant": None if args.gguf else args.quant,
            "gguf_tensor_types": counts, "input_len": args.input_len, "output_len": args.output_len,
            "device_info": device_info(), "gguf": gguf, "float16": dense, "speedup_vs_float16": speedup}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
