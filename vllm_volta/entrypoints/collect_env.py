"""``vllm-volta collect-env``: every decision the platform layer takes on this machine, and why.

Device and capability (and a VLLM_VOLTA_DEVICE_CAPABILITY override), how vllm_volta._C was
built, torch / CUDA / driver versions, what ``--dtype auto`` gives per checkpoint dtype, the
attention backends in priority order with each rejected one's reasons and the KV-cache dtypes,
the linear kernels (dense, 4-bit W4A16, FP8 by capability, GGUF blocks kept, mixture of experts
with quantized experts), the tuned kernel-config files found, CUDA-graph mode and custom
all-reduce.

On a machine without a GPU and with the override set, the GPU decisions for that capability
are reported as well (as the tests that emulate a V100 on a CPU take them). The report is a
list of sections of (key, value) pairs: plain text by default, JSON with ``--json``.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform as py_platform
import shutil
import subprocess
import sys
from typing import Any

import torch

Section = dict[str, Any]
# The checkpoint dtypes --dtype auto is reported for.
_CHECKPOINT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_REPORT_HEAD_SIZE = 128  # the common head size; the attention report is for it


def _driver_version() -> str:
    """The NVIDIA driver version from nvidia-smi, or why there is none."""
    if not torch.cuda.is_available():
        return "none (no CUDA device visible to torch)"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (nvidia-smi not found)"
    proc = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30)
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else "unknown"


def versions() -> Section:
    return {"python": sys.version.split()[0], "os": py_platform.platform(),
            "torch": torch.__version__, "torch CUDA": torch.version.cuda or "none (CPU-only torch)",
            "CUDA available": torch.cuda.is_available(), "driver": _driver_version()}


def extension() -> Section:
    """How vllm_volta._C was built (the adapter macro, CUDA archs) or why it did not load."""
    try:
        from vllm_volta import _C as ext
    except ImportError as e:
        return {"loaded": False, "error": f"{e} (build it: pip install --no-build-isolation -e .)"}
    from vllm_volta import _custom_ops as ops

    archs = getattr(ext, "CUDA_ARCHS", "") or "none"
    built_cuda = bool(getattr(ext, "BUILT_WITH_CUDA", 0))
    adapter = bool(getattr(ext, "V100_ADAPTER", 0))
    if not built_cuda:
        why = "CPU-only build: the V100 adapter functions are the CPU kernels"
    elif adapter:
        why = f"every target arch ({archs}) is below 8.0: CUDA ops are the V100 adapter's"
    else:
        why = f"target archs {archs} include 8.0 or newer: native CUDA kernels (kept Volta-safe)"
    return {"loaded": True, "path": ext.__file__, "BUILT_WITH_CUDA": built_cuda,
            "V100_ADAPTER": adapter, "CUDA_ARCHS": archs, "why": why,
            "CUDA kernels": {op: ops.has_cuda_kernel(op)
                             for op in ("rms_norm", "paged_attention_decode", "gemv", "awq_gemv", "w4_gemv",
                                        "fp8_gemv", "gguf_gemv", "moe_gemv_silu_and_mul", "moe_w4_gemv_act_and_mul")
                             if _op_exists(op)}}


def _op_exists(op: str) -> bool:
    try:
        getattr(torch.ops._C, op)
        return True
    except (AttributeError, RuntimeError):
        return False


def _cuda_op(op: str) -> bool:
    """Whether this build has ``op`` with a CUDA kernel (False for an op an older build lacks)."""
    from vllm_volta import _custom_ops as ops

    return _op_exists(op) and ops.has_cuda_kernel(op)


def device(plat: Any, *, emulated: bool) -> Section:
    from vllm_volta.platforms import resolve_capability_override

    override = resolve_capability_override()
    cap = plat.get_device_capability()
    out: Section = {"platform": type(plat).__name__}
    if plat.is_cuda() and not emulated:
        out["device"] = f"{plat.get_device_name()} x{torch.cuda.device_count()}"
        out["physical capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
        out["memory GiB"] = round(plat.get_device_total_memory() / 2**30, 1)
    elif emulated:
        out["device"] = "none: GPU decisions taken for the VLLM_VOLTA_DEVICE_CAPABILITY override"
    else:
        out["device"] = "cpu (torch sees no CUDA device)"
    out["VLLM_VOLTA_DEVICE_CAPABILITY"] = override.as_version_str() if override else "unset"
    out["capability used"] = cap.as_version_str() if cap else "n/a (CPU)"
    return out


def dtypes(plat: Any) -> Section:
    """What --dtype auto and --dtype bfloat16 give for each checkpoint dtype."""
    from vllm_volta.platforms.dtype import dtype_name

    out: Section = {"supported": [dtype_name(d) for d in plat.supported_dtypes]}
    for ckpt in _CHECKPOINT_DTYPES:
        got = plat.resolve_dtype("auto", ckpt)
        out[f"--dtype auto, {dtype_name(ckpt)} checkpoint"] = f"{dtype_name(got)} ({_why_dtype(plat, ckpt, got)})"
    try:
        plat.resolve_dtype("bfloat16", torch.bfloat16)
        out["--dtype bfloat16"] = "accepted"
    except ValueError as e:
        out["--dtype bfloat16"] = f"refused: {e}"
    return out


def _why_dtype(plat: Any, ckpt: torch.dtype, got: torch.dtype) -> str:
    if plat.is_cpu():
        return "CPU: float32 whatever the checkpoint; bfloat16 makes the default model's greedy answers drift"
    if got == ckpt:
        return "the checkpoint's dtype"
    if ckpt == torch.bfloat16:
        return "cast: bfloat16 needs compute capability 8.0"
    return "float32 checkpoints run float16 on a GPU, as in vLLM"


def attention(plat: Any, dtype: torch.dtype) -> Section:
    """Each backend in priority order: chosen, usable, or its reasons (for ``dtype``)."""
    from vllm_volta import envs
    from vllm_volta.platforms.attention_selector import check_attn_backend
    from vllm_volta.platforms.dtype import dtype_name

    cap = plat.get_device_capability()
    out: Section = {"for": f"{dtype_name(dtype)}, head_size {_REPORT_HEAD_SIZE}",
                    "VLLM_VOLTA_ATTENTION_BACKEND": envs.VLLM_VOLTA_ATTENTION_BACKEND or "unset"}
    chosen = None
    for name in plat.get_attn_backend_priority():
        cls, reasons = check_attn_backend(name, capability=cap, dtype=dtype,
                                          head_size=_REPORT_HEAD_SIZE, device_type=plat.device_type)
        if cls is not None and not reasons:
            out[name] = "usable" if chosen else "CHOSEN (first usable in the priority list)"
            chosen = chosen or name
        else:
            out[name] = "rejected: " + "; ".join(reasons)
    out["chosen"] = chosen or "none can run"
    out["--kv-cache-dtype"] = _kv_cache_dtypes(chosen, dtype)
    return out


def _kv_cache_dtypes(backend: str | None, dtype: torch.dtype) -> str:
    """The KV-cache element types the chosen backend reads for this model dtype."""
    from vllm_volta.attention.kv_cache_dtype import KV_CACHE_DTYPES
    from vllm_volta.platforms.dtype import dtype_name

    text = (f"{', '.join(KV_CACHE_DTYPES)}: auto holds {dtype_name(dtype)}; fp8 / fp8_e4m3 (e4m3fn) and "
            "fp8_e5m2 hold 1 byte per element, scaled per layer by the checkpoint's k/v scales, else 1.0")
    if backend == "VOLTA_PAGED":
        if dtype not in (torch.float16, torch.bfloat16):
            return text + (" (FP8 refused here: the FP8 decode kernels take float16 / bfloat16, not "
                           f"{dtype_name(dtype)})")
        return text + " (FP8 bytes decoded in software by the decode kernels: no FP8 instructions needed)"
    return text + " (FP8 dequantized by PyTorch ops as the cache is read)"


def linear_kernels(plat: Any, dtype: torch.dtype, ext_loaded: bool) -> Section:
    """Dense and quantized GEMM paths for this device and dtype."""
    from vllm_volta import envs
    from vllm_volta.platforms.dtype import dtype_name

    if not ext_loaded:
        return {"dense": "unknown: vllm_volta._C is not loaded"}
    from vllm_volta import _custom_ops as ops
    from vllm_volta.model_executor.layers.decode_gemv import GEMV_MAX_ROWS
    from vllm_volta.model_executor.layers.quantization.awq import kernel_path

    dev = torch.device(plat.device_type)
    gemv_built = ops.has_cuda_kernel("gemv")
    if plat.is_cuda() and dtype == torch.float16 and gemv_built and envs.VLLM_VOLTA_DECODE_GEMV:
        dense = f"gemv kernel for 1-{GEMV_MAX_ROWS} float16 rows (decode), cuBLAS above"
    elif plat.is_cuda():
        why = ("VLLM_VOLTA_DECODE_GEMV=0" if not envs.VLLM_VOLTA_DECODE_GEMV else
               "no CUDA gemv kernel in this build" if not gemv_built else
               f"gemv takes float16 only, the model runs {dtype_name(dtype)}")
        dense = f"cuBLAS (F.linear) for every size ({why})"
    else:
        dense = f"PyTorch CPU GEMM (F.linear), {dtype_name(dtype)}"
    awq = kernel_path(dev, dtype)
    if plat.is_cuda() and not ops.has_cuda_kernel("awq_gemv"):
        awq += "; this build has no CUDA awq_gemv kernel"
    out: Section = {"dense": dense, "AWQ / GPTQ 4-bit": awq, "FP8": _fp8_path(plat, dtype),
                    "GGUF": _gguf_path(dev, dtype), "mixture of experts": _moe_path(plat, dtype)}
    if ops.v100_adapter_build():
        out["gated MLP"] = "gate/up as two GEMMs (V100 adapter build: contiguous rows for silu_and_mul)"
    return out


def _fp8_path(plat: Any, dtype: torch.dtype) -> str:
    """FP8 checkpoints' linear layers on this platform (fp8.py's choice, by capability)."""
    from vllm_volta.model_executor.layers.quantization import fp8_sm70

    if not plat.is_cuda():
        return "weights kept in FP8, dequantized each call for one CPU GEMM"
    sm70 = (f"fp8_gemv up to {fp8_sm70.GEMV_MAX_ROWS} rows, fp8_gemm (WMMA) up to {fp8_sm70.GEMM_MAX_ROWS}, "
            "fp8_dequantize + cuBLAS above, the weight kept in FP8 and converted in registers")
    reason = fp8_sm70.sm70_kernels_reason(torch.device("cuda"), dtype)
    if reason is not None:
        sm70 = f"dequantized each call for one cuBLAS GEMM: {reason}"
    if not plat.has_device_capability(89):
        return f"{sm70}; no FP8 tensor cores below SM89"
    try:
        import triton  # noqa: F401
    except ImportError:
        return f"{sm70}; triton is not installed: no W8A8 GEMM"
    decode = "" if reason else f", decode steps of up to {fp8_sm70.GEMV_MAX_ROWS} rows fp8_gemv"
    return (f"checkpoints with FP8 activations: Triton W8A8 block GEMM (SM89+ FP8 tensor cores){decode}; "
            f"weight-only checkpoints: {sm70}")


def _gguf_path(dev: torch.device, dtype: torch.dtype) -> str:
    """GGUF linear layers: the types kept in blocks, or why everything is dequantized at load."""
    from vllm_volta.model_executor.layers.quantization.gguf import GEMV_MAX_ROWS, _KEPT_NAMES, kernels_reason

    reason = kernels_reason(dev, dtype)
    if reason is not None:
        return f"every type dequantized at load into dense layers: {reason}"
    return (f"{_KEPT_NAMES} kept in blocks: gguf_gemv up to {GEMV_MAX_ROWS} rows, gguf_dequantize + cuBLAS "
            "above; other types dequantized at load")


def _moe_path(plat: Any, dtype: torch.dtype) -> str:
    """Mixture-of-experts layers: the device path (fused_moe.py, fused_moe_quant.py) or the host loop."""
    from vllm_volta import _custom_ops as ops
    from vllm_volta.platforms.dtype import dtype_name

    host = "each used expert's GEMMs on its tokens, grouped on the host (MoE models run without CUDA graphs)"
    if not plat.is_cuda():
        return host
    if not _cuda_op("moe_gemv_silu_and_mul"):
        return f"{host}: this build has no CUDA mixture-of-experts kernels"
    if dtype == torch.bfloat16 and not (plat.has_device_capability(80) and ops.cuda_bf16_kernels_built()):
        return f"{host}: bfloat16 kernels need an SM80+ GPU and build"
    text = ("on the device (CUDA graphs): routing, GEMVs over the chosen experts for decode, WMMA grouped "
            "GEMM above")
    if dtype != torch.float16:
        return text + f"; quantized experts on the host ({dtype_name(dtype)}: their device path runs float16)"
    quant = ("; FP8 experts dequantized per chosen pair, larger batches dequantized chunks + grouped GEMM"
             if _cuda_op("moe_grouped_gemm") else "; quantized experts on the host (no moe_grouped_gemm kernel)")
    if not _cuda_op("moe_grouped_gemm"):
        return text + quant
    if _cuda_op("moe_w4_gemv_act_and_mul"):
        return text + quant + "; 4-bit experts: moe_w4 GEMVs over the chosen experts' packed rows, then as FP8"
    return text + quant + "; 4-bit experts on the host (this build has no moe_w4 kernels)"


def kernel_configs(plat: Any, emulated: bool) -> Section:
    """Tuned launch-config files: the folders searched and the files for this device."""
    from pathlib import Path

    from vllm_volta import envs
    from vllm_volta.kernel_configs import SHIPPED_CONFIG_DIR, normalize_device_name

    user = envs.VLLM_VOLTA_KERNEL_CONFIG_DIR
    dirs = ([Path(user)] if user else []) + [SHIPPED_CONFIG_DIR]
    name = None if emulated else normalize_device_name(plat.get_device_name())
    out: Section = {"searched": [str(d) for d in dirs], "device name in file names": name or "n/a"}
    for d in dirs:
        files = sorted(p.name for p in d.glob("*.json")) if d.is_dir() else []
        mine = [f for f in files if name and f.endswith(f"device_name={name}.json")]
        out[str(d)] = (f"{len(files)} files, {len(mine)} for this device" + (": " + ", ".join(mine) if mine else "")
                       if d.is_dir() else "missing")
    return out


def runtime(plat: Any) -> Section:
    from vllm_volta import envs
    from vllm_volta.config import CUDAGRAPH_MODES

    if plat.is_cuda():
        graphs = (f"{CUDAGRAPH_MODES[0]} by default (--cudagraph-mode: {', '.join(CUDAGRAPH_MODES)}; "
                  f"--enforce-eager: none), captured via {envs.VLLM_VOLTA_CUDA_GRAPH_CAPTURE}")
    else:
        graphs = "none: CUDA graphs need a CUDA device (steps run eagerly)"
    return {"CUDA graphs": graphs,
            "custom all-reduce": ("available (SM80+)" if plat.supports_custom_all_reduce
                                  else "off: NCCL all-reduce (P2P kernels need SM80, or no GPU)")}


def _env_vars() -> Section:
    names = sorted(n for n in os.environ if n.startswith("VLLM_VOLTA_"))
    names += [n for n in ("CUDA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME") if n in os.environ]
    return {n: os.environ[n] for n in names} or {"(none set)": ""}


def _decisions(plat: Any, emulated: bool, ext_loaded: bool) -> list[tuple[str, Section]]:
    run_dtype = plat.resolve_dtype("auto", torch.bfloat16)  # what a bf16 model (most) runs in
    suffix = " (emulated GPU)" if emulated else ""
    return [(f"device{suffix}", device(plat, emulated=emulated)),
            (f"dtype{suffix}", dtypes(plat)),
            (f"attention{suffix}", attention(plat, run_dtype)),
            (f"linear kernels{suffix}", linear_kernels(plat, run_dtype, ext_loaded)),
            (f"kernel configs{suffix}", kernel_configs(plat, emulated)),
            (f"runtime{suffix}", runtime(plat))]


def collect() -> list[tuple[str, Section]]:
    """The whole report, as (section title, {key: value}) pairs."""
    from vllm_volta.platforms import get_current_platform, resolve_capability_override

    plat = get_current_platform()
    ext = extension()
    report = [("versions", versions()), ("extension vllm_volta._C", ext),
              ("environment variables", _env_vars())]
    report += _decisions(plat, False, ext["loaded"])
    if plat.is_cpu() and resolve_capability_override() is not None:
        from vllm_volta.platforms.cuda import CudaPlatform

        report += _decisions(CudaPlatform(), True, ext["loaded"])
    return report


def format_text(report: list[tuple[str, Section]]) -> str:
    lines: list[str] = []
    for title, section in report:
        lines.append(f"== {title} ==")
        for key, value in section.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, list):
                value = ", ".join(map(str, value))
            lines.append(f"  {key}: {value}")
    return "\n".join(lines)


def main(as_json: bool = False) -> str:
    """Print the report (text, or JSON with ``as_json``) and return it."""
    with contextlib.redirect_stdout(sys.stderr):  # the decisions' log lines stay off the report
        report = collect()
    text = json.dumps(dict(report), indent=2, default=str) if as_json else format_text(report)
    print(text)
    return text
