"""One engine of the CPU side-by-side benchmark, kept alive in its own process.

Standalone on purpose (no imports from this repository): it runs under this checkout's Python for
vllm_volta and under upstream vLLM's own virtual environment for vLLM. It loads the model once,
warms up, then answers each ``run`` line on stdin with one JSON line: the timed ``generate`` of
the prompts file (token ids, greedy, ``ignore_eos``). ``quit`` (or end of input) exits.

The JSON goes to a private copy of the original stdout; fd 1 is pointed at stderr first, so
log lines of the engine (and of any process it starts) never mix with the answers.

    python benchmarks/cpu_llm_driver.py --engine vllm_volta --model DIR --dtype bfloat16 \\
        --prompts prompts.json --max-tokens 64 --threads 2 --kv-space-gib 1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

# This folder (first on the path when run as a script) holds benchmarks/kernels/, which would
# shadow the PyPI `kernels` package that transformers imports; the driver needs nothing from it.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

_ENGINES = ("vllm_volta", "vllm")


def _answer_stream() -> Any:
    """A private handle on the original stdout; fd 1 (and sys.stdout) go to stderr afterwards."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _build_llm(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """(LLM, SamplingParams class, facts about the engine) for ``args.engine``."""
    import torch
    torch.set_num_threads(args.threads)
    common = dict(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                  max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                  seed=0, enable_prefix_caching=False)  # every run pays for its prompts
    if args.engine == "vllm":
        # Upstream reads its KV budget (GiB) and its OpenMP binding from the environment.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_space_gib)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
        import vllm
        from vllm import LLM, SamplingParams
        llm = LLM(**common)
        facts = {"version": vllm.__version__,
                 "omp_threads_bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
                 "kv_space_gib": args.kv_space_gib}
    else:
        import vllm_volta
        from vllm_volta import LLM, SamplingParams
        llm = LLM(cpu_kvcache_space=args.kv_space_gib, **common)
        facts = {"version": getattr(vllm_volta, "__version__", "unknown"),
                 "kv_space_gib": args.kv_space_gib}
    facts.update(torch_version=torch.__version__, torch_threads=torch.get_num_threads(),
                 omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
    return llm, SamplingParams, facts


def _run(llm: Any, params: Any, prompts: list[dict[str, list[int]]]) -> dict[str, Any]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    out_tokens = sum(len(t) for t in token_ids)
    in_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    digest = hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:16]
    return {"elapsed_s": elapsed, "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / elapsed,
            "total_tokens_per_s": (in_tokens + out_tokens) / elapsed,
            "outputs_sha256": digest, "token_ids": token_ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=_ENGINES, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-space-gib", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096)
    args = parser.parse_args()
    answers = _answer_stream()
    with open(args.prompts) as f:
        prompts = [{"prompt_token_ids": ids} for ids in json.load(f)]
    llm, sampling_params_cls, facts = _build_llm(args)
    params = sampling_params_cls(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    # Warm-up at the timed batch's shapes (prefill chunks, decode batch): first-call allocations
    # and anything an engine compiles per shape.
    warm = sampling_params_cls(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate(prompts, warm, use_tqdm=False)
    answers.write(json.dumps({"ready": True, **facts}) + "\n")
    for line in sys.stdin:
        if line.strip() != "run":
            break
        answers.write(json.dumps(_run(llm, params, prompts)) + "\n")
    answers.close()


if __name__ == "__main__":
    main()
