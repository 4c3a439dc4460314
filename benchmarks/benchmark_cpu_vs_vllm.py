"""Offline CPU throughput side by side: vllm_volta's LLM against upstream vLLM's CPU build.

    bash /work/shared/peers/vllm-cpu/setup.sh        # once: upstream's venv + the default model
    python benchmarks/benchmark_cpu_vs_vllm.py --dtypes bfloat16 float32 --reps 3

Both engines get the same prompts (random token ids from a fixed seed), greedy sampling,
``max_tokens`` with ``ignore_eos``, the same thread count (torch threads and OpenMP; upstream's
``VLLM_CPU_OMP_THREADS_BIND``), the same KV-cache budget (``VLLM_CPU_KVCACHE_SPACE`` there,
``cpu_kvcache_space`` here) and the same scheduler limits. Each engine lives in its own process
(benchmarks/cpu_llm_driver.py; upstream's under its virtual environment), loaded and warmed up
once per dtype; the timed runs then alternate between the two, the order flipping every
repetition, so that load from other processes on the machine hits both. The JSON holds every
run, the medians, ours / upstream of the medians (> 1: ours is faster), versions and threads,
and how many prompts got the same greedy tokens from both engines.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.utils import log, random_token_prompts, ratio, run_and_emit  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
_DRIVER = Path(__file__).resolve().parent / "cpu_llm_driver.py"
_ENGINES = ("vllm_volta", "vllm")
_DTYPES = ("bfloat16", "float32")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    anchor = os.environ.get("ANCHOR", "/tmp/vllm-cpu-peer")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-env", default=f"{anchor}/env.sh",
                        help="script that activates upstream vLLM's venv (setup.sh writes it)")
    parser.add_argument("--model", default=f"{anchor}/smollm2-hf",
                        help="HF folder both engines load (default: setup.sh's SmolLM2-135M)")
    parser.add_argument("--dtypes", nargs="+", choices=_DTYPES, default=list(_DTYPES))
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3, help="timed runs of each engine per dtype")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-space-gib", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=512)
    # Upstream's CPU defaults for the LLM class (max_num_batched_tokens 4096, max_num_seqs 256).
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts' token ids")
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--output-json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "input_len", "output_len", "reps", "threads", "kv_space_gib"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not Path(args.peer_env).is_file():
        raise ValueError(f"--peer-env {args.peer_env} does not exist; run "
                         f"/work/shared/peers/vllm-cpu/setup.sh (or pass its env.sh)")
    if not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"--model {args.model} has no config.json")
    return args


class Engine:
    """One driver process: started, answered ``ready`` with its facts, then timed on demand."""

    def __init__(self, name: str, args: argparse.Namespace, dtype: str, prompts_file: str) -> None:
        self.name = name
        flags = ["--engine", name, "--model", args.model, "--dtype", dtype, "--prompts", prompts_file,
                 "--max-tokens", str(args.output_len), "--threads", str(args.threads),
                 "--kv-space-gib", str(args.kv_space_gib), "--max-model-len", str(args.max_model_len),
                 "--max-num-seqs", str(args.max_num_seqs),
                 "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        if name == "vllm":
            driver = " ".join(shlex.quote(a) for a in [str(_DRIVER), *flags])
            cmd = ["bash", "-c", f"source {shlex.quote(args.peer_env)} && exec python {driver}"]
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
            env.pop("PYTHONPATH", None)
        else:
            cmd = [sys.executable, str(_DRIVER), *flags]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        log(f"starting {name} ({dtype})")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd=tempfile.gettempdir())
        self.facts = self._read()
        log(f"{name} ready: {self.facts}")

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} driver exited (code {self.proc.wait()}); see its log above")
        return json.loads(line)

    def run(self) -> dict[str, Any]:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Prompts whose greedy tokens are identical, and the mean share of tokens before the first
    difference (bf16 greedy answers drift apart between any two implementations)."""
    same = sum(x == y for x, y in zip(a, b))
    prefix = []
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        prefix.append(n / max(len(x), 1))
    return {"identical_prompts": same / len(a), "mean_common_prefix": statistics.fmean(prefix)}


def bench_dtype(args: argparse.Namespace, dtype: str, prompts_file: str) -> dict[str, Any]:
    engines: dict[str, Engine] = {}
    try:
        for name in _ENGINES:  # one at a time: two loads at once would slow both
            engines[name] = Engine(name, args, dtype, prompts_file)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in _ENGINES}
        for rep in range(args.reps):
            for name in (_ENGINES if rep % 2 == 0 else _ENGINES[::-1]):
                time.sleep(1.0)  # let the other engine's OpenMP threads go idle
                runs[name].append(engines[name].run())
                log(f"{dtype} rep {rep} {name}: {runs[name][-1]['output_tokens_per_s']:.1f} output tok/s")
    finally:
        for engine in engines.values():
            engine.close()
    out: dict[str, Any] = {}
    for name in _ENGINES:
        tps = [r["output_tokens_per_s"] for r in runs[name]]
        out[name] = {"output_tokens_per_s": tps, "median_output_tokens_per_s": statistics.median(tps),
                     "median_total_tokens_per_s": statistics.median(r["total_tokens_per_s"] for r in runs[name]),
                     "output_tokens": runs[name][0]["output_tokens"], **engines[name].facts}
    ours, theirs = out["vllm_volta"], out["vllm"]
    out["ratio"] = ratio(ours["median_output_tokens_per_s"], theirs["median_output_tokens_per_s"])
    out["ratio_per_rep"] = [ratio(a, b) for a, b in zip(ours["output_tokens_per_s"], theirs["output_tokens_per_s"])]
    out["greedy_agreement"] = _agreement(runs["vllm_volta"][-1]["token_ids"], runs["vllm"][-1]["token_ids"])
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    prompts = random_token_prompts(args.num_prompts, args.input_len, vocab, args.seed)

    def run() -> dict[str, Any]:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(prompts, f)
        try:
            results = {dtype: bench_dtype(args, dtype, f.name) for dtype in args.dtypes}
        finally:
            os.unlink(f.name)
        return {"model": args.model, "num_prompts": args.num_prompts, "input_len": args.input_len,
                "output_len": args.output_len, "threads": args.threads, "kv_space_gib": args.kv_space_gib,
                "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
                "reps": args.reps, "cpu": _cpu_model(), "results": results,
                "ratio": {dtype: results[dtype]["ratio"] for dtype in args.dtypes}}

    return run_and_emit(run, args.output_json)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x {os.cpu_count()}"
    except OSError:
        pass
    return f"unknown x {os.cpu_count()}"


if __name__ == "__main__":
    main()
