"""Time or tune the W8A8 block-FP8 Triton GEMM (vllm_volta/model_executor/layers/quantization/
fp8_kernels.py) per weight shape (N, K) and batch size M. Needs a GPU with FP8 tensor cores (SM89+).

    # time the configs in effect (tuned file or default) and print one JSON document
    python benchmarks/kernels/benchmark_w8a8_block_fp8.py --shapes 4096,4096 12288,4096
    # tune: every launch config of the search space per (N, K, M); writes vLLM-named files
    python benchmarks/kernels/benchmark_w8a8_block_fp8.py --tune --model-config /path/to/Qwen3-8B-FP8 --tp-size 2

Shapes are this rank's GEMM shapes: --shapes N,K ..., or --model-config (a config.json or its
folder): q/k/v, o, gate/up and down of a dense decoder split at --tp-size. --tune times the
search space (num_stages 2-5 x BLOCK_SIZE_M 16-256 x BLOCK_SIZE_K 64/128 x BLOCK_SIZE_N 32-256 x
num_warps 4/8 x GROUP_SIZE_M 1-64, BLOCK_SIZE_K dividing --block-k; configs that do not fit the
GPU are skipped) with CUDA events, 5 warm-up (compiling) and 10 timed calls each, keeps the
fastest per M and writes ``N={N},K={K},device_name={GPU},dtype=fp8_w8a8,block_shape=[bn,bk].json``
(vLLM's name and keys: such files drop into vLLM and back) to --save-path, else
VLLM_VOLTA_KERNEL_CONFIG_DIR, else VLLM_TUNED_CONFIG_FOLDER, else the shipped
vllm_volta/kernel_configs/. With several GPUs the batch sizes are spread over them.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.utils import device_info, log, parse_dtype, run_and_emit  # noqa: E402

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
SEARCH_SPACE = {"num_stages": (2, 3, 4, 5), "BLOCK_SIZE_M": (16, 32, 64, 128, 256), "BLOCK_SIZE_K": (64, 128),
                "BLOCK_SIZE_N": (32, 64, 128, 256), "num_warps": (4, 8), "GROUP_SIZE_M": (1, 16, 32, 64)}
# --search small: a few minutes per shape, for checking the tuner end to end
SMALL_SEARCH_SPACE = {"num_stages": (3, 4), "BLOCK_SIZE_M": (16, 64, 128), "BLOCK_SIZE_K": (128,),
                      "BLOCK_SIZE_N": (64, 128), "num_warps": (4,), "GROUP_SIZE_M": (1, 32)}
WARMUP, ITERS = 5, 10


def search_space(block_k: int, space: dict[str, tuple[int, ...]] = SEARCH_SPACE) -> list[dict[str, int]]:
    """Every candidate launch config of ``space`` whose K tile fits in one scale group."""
    keys = list(space)
    configs = [dict(zip(keys, values)) for values in itertools.product(*space.values())]
    return [c for c in configs if block_k % c["BLOCK_SIZE_K"] == 0]


def _shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes takes N,K pairs such as 4096,4096; got {text!r}") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"--shapes: N and K must be positive; got {text!r}")
    return n, k


def model_shapes(config: dict[str, Any], tp_size: int) -> list[tuple[int, int]]:
    """Each rank's (N, K) of a dense decoder's linear layers: qkv, o, gate_up, down."""
    cfg = config.get("text_config") or config
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, inter = cfg.get("num_key_value_heads") or heads, cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    for name, total in (("num_attention_heads", heads), ("intermediate_size", inter)):
        if total % tp_size:
            raise ValueError(f"--tp-size {tp_size} must divide the model's {name} {total}")
    kv_rank = max(kv // tp_size, 1)  # fewer kv heads than ranks: each rank holds one
    shapes = [((heads // tp_size + 2 * kv_rank) * head_dim, hidden), (hidden, heads // tp_size * head_dim),
              (2 * inter // tp_size, hidden), (hidden, inter // tp_size)]
    return list(dict.fromkeys(shapes))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=_shape, nargs="+", default=None, metavar="N,K")
    p.add_argument("--model-config", default=None, help="config.json (or its folder) of a dense decoder")
    p.add_argument("--tp-size", "-tp", type=int, default=1)
    p.add_argument("--batch-sizes", "--batch-size", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--block-n", type=int, default=128)
    p.add_argument("--block-k", type=int, default=128)
    p.add_argument("--out-dtype", default="float16", choices=("float16", "half", "bfloat16", "float32"))
    p.add_argument("--tune", action="store_true", help="search the launch configs and write the JSON files")
    p.add_argument("--search", choices=("full", "small"), default="full",
                   help="full: vLLM's search space (1280 configs); small: 24, to check the tuner quickly")
    p.add_argument("--save-path", default=None, help="folder for the tuned files")
    p.add_argument("--num-gpus", type=int, default=None, help="GPUs to spread batch sizes over (default: all)")
    p.add_argument("--output-json", default=None, help="also write the JSON result here")
    args = p.parse_args(argv)
    if (args.shapes is None) == (args.model_config is None):
        p.error("give exactly one of --shapes and --model-config")
    if args.tp_size < 1 or args.block_n < 1 or args.block_k < 1 or any(m < 1 for m in args.batch_sizes):
        p.error("--tp-size, --block-n, --block-k and --batch-sizes must be positive")
    if args.model_config is not None:
        path = Path(args.model_config)
        path = path / "config.json" if path.is_dir() else path
        args.shapes = model_shapes(json.loads(path.read_text()), args.tp_size)
    return args


def _inputs(m: int, n: int, k: int, block: tuple[int, int], device: torch.device):
    from vllm_volta.model_executor.layers.quantization.fp8_kernels import FP8_DTYPE, per_token_group_quant_fp8

    x = torch.randn(m, k, device=device, dtype=torch.float16)
    q, q_scales = per_token_group_quant_fp8(x, block[1])
    weight = (torch.randn(n, k, device=device) * 64).clamp(-448, 448).to(FP8_DTYPE)
    w_scales = torch.rand(n, -(-k // block[1]), device=device) * 1e-3
    return q, q_scales, weight, w_scales


def time_config(inputs, block: tuple[int, int], out_dtype: torch.dtype, config: dict[str, int]) -> float:
    """Mean seconds of one GEMM launch (CUDA events) after WARMUP calls."""
    from vllm_volta.model_executor.layers.quantization.fp8_kernels import w8a8_scaled_mm

    def call() -> None:
        w8a8_scaled_mm(*inputs, block[1], out_dtype, config)

    for _ in range(WARMUP):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(ITERS):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / ITERS


def tune_batch_sizes(gpu: int, shapes, batch_sizes, block, out_dtype, space) -> dict[tuple[int, int], dict[int, Any]]:
    """{(N, K): {M: (best config, seconds)}} for ``batch_sizes`` on GPU ``gpu``."""
    from triton.runtime.errors import OutOfResources

    torch.cuda.set_device(gpu)
    device = torch.device("cuda", gpu)
    candidates = search_space(block[1], space)
    best: dict[tuple[int, int], dict[int, Any]] = {}
    for (n, k), m in itertools.product(shapes, batch_sizes):
        inputs = _inputs(m, n, k, block, device)
        timed = []
        for config in candidates:
            try:
                timed.append((time_config(inputs, block, out_dtype, config), config))
            except OutOfResources:  # too much shared memory / registers for this GPU
                continue
        if not timed:
            raise RuntimeError(f"no launch config of the search space runs N={n} K={k} M={m} on this GPU")
        seconds, config = min(timed, key=lambda t: t[0])
        best.setdefault((n, k), {})[m] = (config, seconds)
        log(f"GPU {gpu} N={n} K={k} M={m}: {seconds * 1e6:.1f} us with {config}")
    return best


def _tune(args: argparse.Namespace, block: tuple[int, int], out_dtype: torch.dtype) -> dict[tuple[int, int], dict]:
    space = SEARCH_SPACE if args.search == "full" else SMALL_SEARCH_SPACE
    gpus = min(args.num_gpus or torch.cuda.device_count(), torch.cuda.device_count(), len(args.batch_sizes))
    if gpus <= 1:
        return tune_batch_sizes(torch.cuda.current_device(), args.shapes, args.batch_sizes, block, out_dtype, space)
    import multiprocessing as mp

    parts = [args.batch_sizes[i::gpus] for i in range(gpus)]
    with mp.get_context("spawn").Pool(gpus) as pool:
        results = pool.starmap(tune_batch_sizes, [(g, args.shapes, parts[g], block, out_dtype, space)
                                                       for g in range(gpus)])
    merged: dict[tuple[int, int], dict] = {}
    for result in results:
        for shape, table in result.items():
            merged.setdefault(shape, {}).update(table)
    return merged


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_volta.kernel_configs import get_w8a8_block_fp8_config, write_w8a8_block_fp8_configs

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        raise RuntimeError("benchmark_w8a8_block_fp8 needs a CUDA GPU with FP8 tensor cores (SM89+)")
    block, out_dtype = (args.block_n, args.block_k), parse_dtype(args.out_dtype)
    results, files = [], []
    if args.tune:
        for (n, k), table in sorted(_tune(args, block, out_dtype).items()):
            configs = {m: cfg for m, (cfg, _) in sorted(table.items())}
            path = write_w8a8_block_fp8_configs(configs, n, k, block, directory=args.save_path)
            log(f"Writing best config to {path}")
            files.append(str(path))
            results += [{"N": n, "K": k, "M": m, "config": cfg, "us": s * 1e6,
                         "tflops": 2 * m * n * k / s / 1e12} for m, (cfg, s) in sorted(table.items())]
    else:
        device = torch.device("cuda")
        for (n, k), m in itertools.product(args.shapes, args.batch_sizes):
            config = get_w8a8_block_fp8_config(m, n, k, block)
            seconds = time_config(_inputs(m, n, k, block, device), block, out_dtype, config)
            results.append({"N": n, "K": k, "M": m, "config": config, "us": seconds * 1e6,
                            "tflops": 2 * m * n * k / seconds / 1e12})
            log(f"N={n} K={k} M={m}: {seconds * 1e6:.1f} us, {results[-1]['tflops']:.1f} TFLOPS")
    return {"benchmark": "kernels/benchmark_w8a8_block_fp8", "device_info": device_info(), "tune": args.tune,
            "block_shape": list(block), "out_dtype": args.out_dtype, "config_files": files, "results": results}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
