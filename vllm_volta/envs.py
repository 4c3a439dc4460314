"""Every environment variable vllm_volta reads, documented and parsed in one place.

Values are read lazily, on each attribute access (``envs.VLLM_VOLTA_LOGGING_LEVEL``), never at
import, so tests and users can change them at run time. A malformed value raises ValueError
naming the variable and the accepted form.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_CAPABILITY_FORMS = '"<major>.<minor>" such as "7.0", "7.5", "8.0", "9.0" (or "70", "75", "80", "90")'
_DOTTED = re.compile(r"(\d{1,2})\.(\d)")
_COMPACT = re.compile(r"(\d{1,2})(\d)")


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, what it does, and how its text is parsed."""

    name: str
    doc: str
    parse: Callable[[str | None], Any]


def raw(name: str) -> str | None:
    """The variable's unparsed text; unset and blank both give None ("use the default").

    For hot paths that cache on the text and parse with ``ENV_VARS[name].parse`` only on change.
    """
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def parse_device_capability(value: str | None) -> tuple[int, int] | None:
    """Parse VLLM_VOLTA_DEVICE_CAPABILITY into (major, minor), or None when unset."""
    if value is None:
        return None
    match = _DOTTED.fullmatch(value) or _COMPACT.fullmatch(value)
    if match is None:
        raise ValueError(
            f"VLLM_VOLTA_DEVICE_CAPABILITY={value!r} is not a compute capability; "
            f"expected {_CAPABILITY_FORMS}"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    if major < 1:
        raise ValueError(
            f"VLLM_VOLTA_DEVICE_CAPABILITY={value!r}: the major version must be at least 1; "
            f"expected {_CAPABILITY_FORMS}"
        )
    return major, minor


def _parse_logging_level(value: str | None) -> str:
    if value is None:
        return "INFO"
    level = value.upper()
    if level not in _LOG_LEVELS:
        raise ValueError(
            f"VLLM_VOLTA_LOGGING_LEVEL={value!r} is not a logging level; "
            f"expected one of {', '.join(_LOG_LEVELS)}"
        )
    return level


def _parse_path(value: str | None) -> str | None:
    return None if value is None else os.path.abspath(os.path.expanduser(value))


def _parse_cache_root(value: str | None) -> str:
    if value is not None:
        return os.path.abspath(os.path.expanduser(value))
    # Same convention as huggingface_hub and vLLM: honour XDG_CACHE_HOME.
    base = raw("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.abspath(os.path.join(os.path.expanduser(base), "vllm_volta"))


def _parse_cpu_kvcache_space(value: str | None) -> float:
    if value is None:
        return 4.0
    try:
        gib = float(value)
    except ValueError:
        gib = float("nan")
    if not gib > 0 or gib == float("inf"):
        raise ValueError(
            f"VLLM_VOLTA_CPU_KVCACHE_SPACE={value!r} is not a size; expected a positive number "
            "of GiB such as 4 or 0.5"
        )
    return gib


def _parse_switch(name: str, default: bool) -> Callable[[str | None], bool]:
    def parse(value: str | None) -> bool:
        if value is None:
            return default
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}={value!r} is not a switch; expected 1/0, true/false, yes/no or on/off")
    return parse


def _parse_graph_capture(value: str | None) -> str:
    if value is None:
        return "driver"
    if value.lower() not in ("driver", "torch"):
        raise ValueError(f"VLLM_VOLTA_CUDA_GRAPH_CAPTURE={value!r} is not a capture path; expected driver or torch")
    return value.lower()


def _parse_fault_steps(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS={value!r} is not a step count; "
                         "expected a non-negative integer")
    return int(value)


def _parse_cudart(value: str | None) -> str:
    if value is None:
        return "static"
    if value not in ("static", "shared"):
        raise ValueError(f"VLLM_VOLTA_CUDART={value!r} is not a linking mode; expected static or shared")
    return value


def _parse_backend_name(value: str | None) -> str | None:
    # Names are validated against the registry by the selector, which knows the full list.
    return None if value is None else value.upper()


ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "VLLM_VOLTA_DEVICE_CAPABILITY",
            "Pretend the GPU has this compute capability (7.0, 7.5, 8.0, 9.0...): dtype, attention "
            "backends and custom all-reduce follow it, and the tensor-core decode attention keeps "
            "its blocks within that capability's shared memory per SM. For testing the Volta "
            "path on newer GPUs and for drivers that misreport. Unset: ask the device.",
            parse_device_capability,
        ),
        EnvVar(
            "VLLM_VOLTA_LOGGING_LEVEL",
            "Level of the vllm_volta loggers: DEBUG, INFO (default), WARNING, ERROR, CRITICAL.",
            _parse_logging_level,
        ),
        EnvVar(
            "VLLM_VOLTA_KERNEL_CONFIG_DIR",
            "Folder of tuned kernel launch configs (JSON) that take precedence over the configs "
            "shipped in vllm_volta/kernel_configs/. Unset: shipped configs only.",
            _parse_path,
        ),
        EnvVar(
            "VLLM_TUNED_CONFIG_FOLDER",
            "vLLM's folder of user-tuned Triton configs: W8A8 block-FP8 GEMM files named as vLLM "
            "names them (N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[..].json) are "
            "looked up there after VLLM_VOLTA_KERNEL_CONFIG_DIR and before the shipped folder.",
            _parse_path,
        ),
        EnvVar(
            "VLLM_VOLTA_CACHE_ROOT",
            "Root folder for vllm_volta's caches. Default: $XDG_CACHE_HOME/vllm_volta, "
            "i.e. ~/.cache/vllm_volta.",
            _parse_cache_root,
        ),
        EnvVar(
            "VLLM_VOLTA_CPU_KVCACHE_SPACE",
            "KV-cache budget in GiB when running on the CPU (a positive number; default 4).",
            _parse_cpu_kvcache_space,
        ),
        EnvVar(
            "VLLM_VOLTA_ATTENTION_BACKEND",
            "Force one attention backend by name (e.g. TORCH_SDPA, VOLTA_PAGED); it is still "
            "checked against the device. Unset: the platform's priority list decides.",
            _parse_backend_name,
        ),
        EnvVar(
            "VLLM_VOLTA_DECODE_GEMV",
            "Linear layers multiply 1 or 2 float16 token rows on a CUDA GPU (decode steps) with "
            "vllm_volta's gemv kernel (on by default); 0 gives every size to cuBLAS. Read when a "
            "model is built.",
            _parse_switch("VLLM_VOLTA_DECODE_GEMV", True),
        ),
        EnvVar(
            "VLLM_VOLTA_PDL",
            "Launch the decode kernels (gemv, paged attention) of 3+ rows as programmatic "
            "dependent launches on SM90+ GPUs (on by default): each starts loading its weights "
            "while the kernel before it finishes. 0 launches them one after the other. Read once "
            "per process, at the first such launch.",
            _parse_switch("VLLM_VOLTA_PDL", True),
        ),
        EnvVar(
            "VLLM_PP_LAYER_PARTITION",
            "vLLM's pipeline-parallel layer split: decoder layers per stage, a comma list of "
            "pipeline_parallel_size positive counts that add up to the model's layers (e.g. 5,3). "
            "Unset: vLLM's split, the remainder to the stages before the last. Checked against the model "
            "when the engine is configured (model_executor/layers/pp_partition.py).",
            lambda value: None if value is None else value.strip(),
        ),
        EnvVar(
            "VLLM_VOLTA_CUDA_GRAPH_CAPTURE",
            "How decode CUDA graphs are captured: driver (default; the CUDA driver API, see "
            "vllm_volta/worker/driver_graph.py) or torch (torch.cuda.CUDAGraph, also the fallback "
            "where the driver path is not available).",
            _parse_graph_capture,
        ),
        # Read by setup.py / cmake/build_target.py when the extension is built (listed here so
        # that every variable the project reads is in one place).
        EnvVar(
            "VLLM_VOLTA_FORCE_CPU",
            "Build time: 1 builds the CPU kernels only (the V100 adapter functions), whatever torch "
            "and nvcc are present.",
            _parse_switch("VLLM_VOLTA_FORCE_CPU", False),
        ),
        EnvVar(
            "VLLM_VOLTA_CUDART",
            "Build time: how the CUDA runtime is linked into the extension, static (default) or "
            "shared (then nvcc's CUDA major version must equal torch's).",
            _parse_cudart,
        ),
        EnvVar(
            "VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS",
            "For testing how a server survives engine death: the server's engine loop fails as a "
            "dead engine would after this many steps (once; a restarted engine runs normally). "
            "Unset: never.",
            _parse_fault_steps,
        ),
    )
}


def get(name: str) -> Any:
    """Read and parse environment variable ``name`` now (KeyError if vllm_volta does not use it)."""
    return ENV_VARS[name].parse(raw(name))


def cpu_kvcache_space_bytes() -> int:
    """VLLM_VOLTA_CPU_KVCACHE_SPACE converted from GiB to bytes."""
    return int(get("VLLM_VOLTA_CPU_KVCACHE_SPACE") * (1 << 30))


def __getattr__(name: str) -> Any:
    # Module-level attribute access is the lazy read: envs.VLLM_VOLTA_X parses os.environ now.
    if name in ENV_VARS:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(ENV_VARS))
