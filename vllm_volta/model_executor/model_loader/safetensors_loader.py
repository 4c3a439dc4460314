"""Stream (name, tensor) pairs out of a folder of safetensors files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from vllm_volta.transformers_utils.config import list_safetensors


def iterate_safetensors_weights(folder: str | Path, use_tqdm: bool = True
                                ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of the checkpoint in ``folder`` (sharded or not) on the CPU,
    one shard file at a time, with a progress bar over the shards."""
    files = list_safetensors(folder)
    if not files:
        raise ValueError(f"no *.safetensors files in {str(folder)!r}")
    for file in tqdm(files, desc="Loading safetensors checkpoint shards", unit="shard",
                     disable=not use_tqdm):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
