"""``vllm-volta bench latency | throughput | serve``: the benchmarks in benchmarks/ under
vLLM's subcommand names.

The benchmarks are not part of the installed package (they import transformers references,
nvidia-smi samplers and tuners a server does not need), so this runs them from the source tree
of an editable install (``pip install -e .`` from a clone); anywhere else it stops with a
message saying so. Flags are the scripts' own, which already use vLLM's names; a few
vLLM-only spellings are translated (``--backend vllm``; for ``serve``, ``--host`` / ``--port``
of a running server and ``--dataset-name random``).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable

BENCHMARKS = {"latency": "benchmark_latency", "throughput": "benchmark_throughput",
              "serve": "benchmark_serving"}
_DATASETS = ("random",)


def source_root() -> Path | None:
    """The clone this package runs from, when it holds benchmarks/ (an editable install)."""
    import vllm_volta

    root = Path(vllm_volta.__file__).resolve().parent.parent
    return root if (root / "benchmarks" / "__init__.py").is_file() else None


def _take(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """Remove ``flag VALUE`` / ``flag=VALUE`` from argv; returns (value, the rest)."""
    value, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == flag:
            if i + 1 >= len(argv):
                raise ValueError(f"{flag} needs a value")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return value, rest


def translate_vllm_flags(kind: str, argv: list[str]) -> list[str]:
    """vLLM's spellings of a benchmark's flags -> ours; values we cannot honour are refused."""
    if kind not in BENCHMARKS:
        raise ValueError(f"bench: unknown benchmark {kind!r}; choose one of {', '.join(BENCHMARKS)}")
    backend, argv = _take(argv, "--backend")
    if kind == "serve":
        if backend not in (None, "vllm", "openai"):
            raise ValueError(f"--backend {backend!r} is not supported by bench serve; supported: vllm, openai")
        dataset, argv = _take(argv, "--dataset-name")
        if dataset not in (None, *_DATASETS):
            raise ValueError(f"--dataset-name {dataset!r} is not supported; supported: {', '.join(_DATASETS)}")
        host, argv = _take(argv, "--host")
        port, argv = _take(argv, "--port")
        if host is not None or port is not None:
            if any(a == "--base-url" or a.startswith("--base-url=") for a in argv):
                raise ValueError("give either --base-url or --host/--port, not both")
            argv = [*argv, "--base-url", f"http://{host or 'localhost'}:{port or 8000}"]
        return argv
    if backend is not None:
        argv = [*argv, "--backend", "vllm-volta" if backend == "vllm" else backend]
    return argv


def load_benchmark(kind: str) -> Callable[[list[str]], Any]:
    """The benchmark's ``main``, imported from the source tree."""
    root = source_root()
    if root is None:
        raise SystemExit(
            "vllm-volta bench runs the benchmarks in a source checkout's benchmarks/ folder, "
            "which installed wheels do not include: clone the repository and pip install -e . "
            f"there (or run python benchmarks/{BENCHMARKS[kind]}.py from the clone)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.{BENCHMARKS[kind]}").main


def run_bench(kind: str, argv: list[str]) -> Any:
    """Run benchmark ``kind`` with the (vLLM-spelled) flags; it prints its JSON on stdout."""
    main = load_benchmark(kind)
    flags = translate_vllm_flags(kind, list(argv))
    prog, sys.argv[0] = sys.argv[0], f"vllm-volta bench {kind}"  # the benchmark's usage line
    try:
        return main(flags)
    finally:
        sys.argv[0] = prog
