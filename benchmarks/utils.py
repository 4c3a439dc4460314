"""Helpers shared by the benchmark scripts.

Random token-id prompts, percentile summaries, device timing (with CUDA sync), the one-JSON
document output convention, device-to-device copy bandwidth and weight bytes per decode step.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"

_DTYPES = {
    "half": torch.float16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def log(msg: str) -> None:
    """Progress goes to stderr: stdout carries only the JSON result."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def shipped_configs() -> list[str]:
    """Names of the model configs shipped in benchmarks/configs/."""
    return sorted(p.parent.name for p in CONFIGS_DIR.glob("*/config.json"))


def resolve_model(model: str | None, config: str | None) -> str:
    """Turn --model / --config into the model argument the engine and transformers take.

    ``config`` is a shipped config name (``llama-3-8b``) or a path to a directory or a
    config.json file; ``model`` is an HF name or a local directory.
    """
    if (model is None) == (config is None):
        raise ValueError("give exactly one of --model or --config "
                         f"(shipped configs: {', '.join(shipped_configs())})")
    if model is not None:
        return model
    path = Path(config)
    if path.name == "config.json" and path.is_file():
        return str(path.parent)
    if path.is_dir() and (path / "config.json").is_file():
        return str(path)
    shipped = CONFIGS_DIR / config
    if (shipped / "config.json").is_file():
        return str(shipped)
    raise ValueError(f"--config {config!r} is neither a directory with config.json nor one "
                     f"of the shipped configs: {', '.join(shipped_configs())}")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map a CLI dtype name to a torch dtype ('auto' is resolved by the engine, not here)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def require_cuda(script: str) -> torch.device:
    """The GPU a kernel benchmark runs on; a clear error without one."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{script} needs a CUDA GPU")
    return torch.device("cuda")


def random_token_prompts(num_prompts: int, input_len: int, vocab_size: int,
                         seed: int, lengths: Sequence[int] | None = None) -> list[list[int]]:
    """``num_prompts`` prompts of exactly ``input_len`` random token ids in [0, vocab_size)
    (or of ``lengths[i]`` ids each, when given)."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if input_len < 1:
        raise ValueError(f"input_len must be >= 1, got {input_len}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    rng = np.random.default_rng(seed)
    if lengths is None:
        ids = rng.integers(0, vocab_size, size=(num_prompts, input_len), dtype=np.int64)
        return ids.tolist()
    return [rng.integers(0, vocab_size, size=n, dtype=np.int64).tolist() for n in lengths]


def random_lengths(num: int, length: int, range_ratio: float, seed: int) -> list[int]:
    """vLLM's random dataset lengths: uniform integers in [length * (1 - range_ratio),
    length * (1 + range_ratio)] (truncated, at least 1); all ``length`` at ratio 0."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    low = max(int(length * (1 - range_ratio)), 1)
    high = max(int(length * (1 + range_ratio)), low)
    rng = np.random.default_rng(seed)
    return rng.integers(low, high + 1, size=num).tolist()


def summarize(values: Sequence[float], percentiles: Sequence[float] = (50, 90, 99),
              *, scale: float = 1.0, name: str = "") -> dict[str, float]:
    """mean / median / std / pN of ``values`` x ``scale``, keyed ``mean_<name>``, ``p99_<name>``
    (just ``mean``, ``p99`` without a name), as vLLM's benchmarks name them."""
    if len(values) == 0:
        raise ValueError("cannot summarize an empty list of measurements")
    arr = np.asarray(values, dtype=np.float64) * scale
    suffix = f"_{name}" if name else ""
    out = {
        f"mean{suffix}": float(arr.mean()),
        f"median{suffix}": float(np.median(arr)),
        f"std{suffix}": float(arr.std()),
    }
    for p in percentiles:
        if not 0 <= p <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {p}")
        key = f"p{int(p) if float(p).is_integer() else p}{suffix}"
        out[key] = float(np.percentile(arr, p))
    return out


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued device work, so wall-clock timings include it."""
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed(device: torch.device | str | None = None) -> Iterator[dict[str, float]]:
    """``with timed(dev) as t: ...`` then ``t["elapsed"]`` holds seconds, synced on both ends."""
    box: dict[str, float] = {}
    synchronize(device)
    start = time.perf_counter()
    try:
        yield box
    finally:
        synchronize(device)
        box["elapsed"] = time.perf_counter() - start


def measure_copy_bandwidth(device: torch.device | str, nbytes: int = 1 << 30,
                           iters: int = 20, warmup: int = 3) -> dict[str, float]:
    """Device-to-device copy bandwidth with one large ``dst.copy_(src)``.

    Bandwidth counts bytes read plus bytes written (2 x nbytes per copy): that is the DRAM
    traffic of the copy, the same quantity a decode step spends reading weights.
    """
    if nbytes < 1 << 20:
        raise ValueError(f"copy_bytes must be >= 1 MiB, got {nbytes}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    device = torch.device(device)
    numel = nbytes // 2
    src = torch.empty(numel, dtype=torch.float16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    with timed(device) as t:
        for _ in range(iters):
            dst.copy_(src)
    moved = 2 * src.numel() * src.element_size()
    seconds = t["elapsed"] / iters
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the 2 x nbytes back before an engine sizes its KV cache
    return {"copy_bytes": float(moved // 2), "seconds_per_copy": seconds,
            "bandwidth_bytes_per_s": moved / seconds}


def _quantized_weight_bytes(quant: Any, elt: int) -> float:
    """Bytes one weight of a quantized linear layer costs: its packed bits plus its share of the
    per-group scale (in the activation dtype, FP32 for FP8 blocks) and zero point."""
    bits = getattr(quant, "bits", 4 if hasattr(quant, "group_size") else 8)
    if hasattr(quant, "block_shape"):  # FP8: one byte, an FP32 scale per block (per row / tensor: ~0)
        block = quant.block_shape
        return 1.0 + (4.0 / (block[0] * block[1]) if block else 0.0)
    group = quant.group_size
    zeros = bits / 8 if getattr(quant, "has_zeros", True) else 0.0
    return bits / 8 + ((elt + zeros) / group if group > 0 else 0.0)


def weight_bytes_per_token(hf_config: Any, dtype: torch.dtype) -> dict[str, float]:
    """Bytes of weights one decode step reads, from the model shape alone.

    Every parameter is read once per step except the input embedding table, of which only
    one row per token is gathered (it is counted fully when tied to the LM head). In a quantized
    checkpoint (AWQ / GPTQ / compressed-tensors / FP8 ``quantization_config``) the decoder's linear
    layers read their packed bits per weight plus their share of the group scales and zero points.
    """
    import copy

    from transformers import AutoModelForCausalLM

    from vllm_volta.model_executor.layers.quantization import get_quant_config

    quant = get_quant_config(hf_config)
    if quant is not None:  # the dense model of the same shape
        hf_config = copy.deepcopy(hf_config)
        del hf_config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    read = total if tied else total - embed.numel() + embed.shape[1]
    elt = torch.empty((), dtype=dtype).element_size()
    nbytes = float(read * elt)
    if quant is not None:
        packed = sum(m.weight.numel() for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and ".layers." in name)
        nbytes += packed * (_quantized_weight_bytes(quant, elt) - elt)
    return {"num_parameters": float(total), "weight_bytes_per_token": nbytes}


def device_info() -> dict[str, Any]:
    """What ran the benchmark: device, torch, and the knobs that select Volta mode and the
    kernel / graph paths."""
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    else:
        info["device"] = "cpu"
    for var in ("VLLM_VOLTA_DEVICE_CAPABILITY", "TORCH_CUDA_ARCH_LIST", "VLLM_VOLTA_CUDA_GRAPH_CAPTURE",
                "VLLM_VOLTA_DECODE_GEMV", "VLLM_VOLTA_PDL"):
        info[var] = os.environ.get(var)
    try:  # how the ops extension was built: Volta mode needs the adapter build
        import vllm_volta._C as ext

        info["extension"] = {"path": ext.__file__, "v100_adapter": bool(ext.V100_ADAPTER),
                             "cuda_archs": ext.CUDA_ARCHS}
        if torch.cuda.is_available():
            from vllm_volta import _custom_ops

            info["extension"]["programmatic_launch"] = _custom_ops.programmatic_launch(torch.cuda.current_device())
    except (ImportError, AttributeError) as e:
        info["extension"] = {"error": f"{type(e).__name__}: {e}"}
    return info


def ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if theirs > 0 else None


def _finite(obj: Any) -> Any:
    """JSON has no inf/NaN: write them as strings ("inf" request rate stays readable)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def run_and_emit(run: Callable[[], dict[str, Any]], output_json: str | None) -> dict[str, Any]:
    """Run a benchmark with stdout diverted to stderr, then print its one JSON document.

    Libraries sometimes print to stdout; diverting keeps stdout parseable as one document.
    """
    with contextlib.redirect_stdout(sys.stderr):
        result = _finite(run())
    text = json.dumps(result, indent=2, allow_nan=False)
    print(text, flush=True)
    if output_json:
        Path(output_json).write_text(text + "\n")
        log(f"wrote {output_json}")
    return result
