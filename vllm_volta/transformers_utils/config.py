"""Resolve a user's ``model`` argument to local files and its transformers config.

``model`` may be a local HF folder (config.json + *.safetensors, optionally sharded with
model.safetensors.index.json), a local .gguf file (or a folder holding exactly one), or a
Hugging Face hub name, downloaded with huggingface_hub (config, safetensors and tokenizer
files only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_volta.logger import init_logger

logger = init_logger(__name__)

# What a served model needs from a hub repo: config, weights, tokenizer and chat template.
HUB_ALLOW_PATTERNS = [
    "*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja",
]


@dataclass
class ModelSource:
    """Where a model lives. ``format`` is "safetensors" (HF folder) or "gguf" (single file)."""

    model: str  # as the user gave it
    path: Path  # the HF folder, or the .gguf file
    format: str
    hf_config: Any  # transformers.PretrainedConfig


def resolve_model_source(model: str, revision: str | None = None,
                         trust_remote_code: bool = False,
                         require_weights: bool = True) -> ModelSource:
    """Find ``model`` locally or on the hub and load its config.

    ``require_weights=False`` (load format "dummy") accepts a folder holding only config.json.
    """
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ValueError(f"model must be a local path or a hub name, got {model!r}")
    model = str(model)
    local = Path(model).expanduser()
    if local.exists():
        path = local.resolve()
    elif _looks_like_path(model):
        raise ValueError(f"model path {model!r} does not exist")
    else:
        path = download_from_hub(model, revision)
    return _source_at(model, path, trust_remote_code, require_weights)


def _looks_like_path(model: str) -> bool:
    # Hub names are "name" or "org/name"; anything else is meant as a file system path.
    return (model.startswith((".", "/", "~")) or model.endswith(".gguf")
            or model.count("/") > 1 or os.sep != "/" and os.sep in model)


def _source_at(model: str, path: Path, trust_remote_code: bool,
               require_weights: bool = True) -> ModelSource:
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file {str(path)!r} is not a .gguf file; pass a .gguf file or "
                             "a folder with config.json and *.safetensors")
        return ModelSource(model, path, "gguf", _gguf_config(path))
    if (path / "config.json").is_file():
        if require_weights and not list_safetensors(path):
            raise ValueError(f"model folder {str(path)!r} has config.json but no *.safetensors "
                             "weights (only safetensors and GGUF checkpoints are supported)")
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        return ModelSource(model, path, "safetensors", config)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(model, ggufs[0], "gguf", _gguf_config(ggufs[0]))
    what = f"{len(ggufs)} .gguf files (pass one of them)" if ggufs else "no config.json"
    raise ValueError(f"model folder {str(path)!r} has {what}")


def _gguf_config(path: Path) -> Any:
    from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config
    return load_gguf_config(path)


def list_safetensors(folder: Path | str) -> list[Path]:
    """The checkpoint's safetensors files: those named by model.safetensors.index.json if present,
    else every *.safetensors in the folder (sorted)."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        import json
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names missing shard files: {', '.join(missing)}")
        return files
    return sorted(folder.glob("*.safetensors"))


def download_from_hub(repo_id: str, revision: str | None = None) -> Path:
    """Snapshot the repo's config, safetensors and tokenizer files; the local cache is used
    when it already holds them (and is the only option offline)."""
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(repo_id, revision=revision,
                                      allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (fully): fetch it
        pass
    logger.info("Downloading %s from the Hugging Face hub", repo_id)
    try:
        return Path(snapshot_download(repo_id, revision=revision,
                                      allow_patterns=HUB_ALLOW_PATTERNS))
    except Exception as e:  # noqa: BLE001 - network, auth, unknown repo: all end here
        raise ValueError(
            f"model {repo_id!r} is not a local path and could not be downloaded from the "
            f"Hugging Face hub ({type(e).__name__}: {e}). If this machine is offline, download "
            "the model elsewhere and pass its local folder or .gguf file") from e
