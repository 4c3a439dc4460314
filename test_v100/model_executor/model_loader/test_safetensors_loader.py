from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from vllm_volta.model_executor.model_loader.safetensors_loader import iterate_safetensors_weights


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {f"w{i}": torch.randn(3, i + 1, generator=g) for i in range(5)}


def test_single_file(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    got = dict(iterate_safetensors_weights(tmp_path, use_tqdm=False))
    assert got.keys() == tensors.keys()
    for name, t in tensors.items():
        assert torch.equal(got[name], t)


def test_sharded_by_index(tmp_path):
    tensors = _tensors()
    shards = {"a.safetensors": ["w0", "w3"], "b.safetensors": ["w1", "w2", "w4"]}
    for file, names in shards.items():
        save_file({n: tensors[n] for n in names}, tmp_path / file)
    save_file({"stray": torch.zeros(1)}, tmp_path / "not_in_index.safetensors")
    weight_map = {n: f for f, names in shards.items() for n in names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    got = dict(iterate_safetensors_weights(tmp_path, use_tqdm=False))
    assert got.keys() == tensors.keys()  # only the indexed shards are read
    assert all(torch.equal(got[n], t) for n, t in tensors.items())

    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(ValueError, match="missing shard"):
        list(iterate_safetensors_weights(tmp_path, use_tqdm=False))


def test_no_files(tmp_path):
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        list(iterate_safetensors_weights(tmp_path))
