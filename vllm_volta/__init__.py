"""vllm-volta: vLLM's API and engine, fast on V100/T4 and native on Ampere/Hopper.

The public names are imported lazily so that `import vllm_volta` stays light (no torch
or transformers until an engine is built).
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "vllm_volta.entrypoints.llm",
    "SamplingParams": "vllm_volta.sampling_params",
    "RequestOutput": "vllm_volta.outputs",
    "CompletionOutput": "vllm_volta.outputs",
    "PoolingParams": "vllm_volta.pooling_params",
    "EmbeddingRequestOutput": "vllm_volta.outputs",
    "EngineArgs": "vllm_volta.engine.arg_utils",
    "LLMEngine": "vllm_volta.engine.llm_engine",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vllm_volta' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
