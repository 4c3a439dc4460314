"""resolve_model_source: local HF folders, GGUF files, hub names (hub calls faked)."""

from __future__ import annotations

import json

import huggingface_hub
import pytest
import torch
import transformers
from safetensors.torch import save_file

from vllm_volta.transformers_utils import config as cfg_mod
from vllm_volta.transformers_utils.config import resolve_model_source


def _hf_folder(folder, arch="Qwen2ForCausalLM"):
    config = transformers.Qwen2Config(hidden_size=32, num_attention_heads=2, num_hidden_layers=1,
                                      intermediate_size=48, vocab_size=50)
    config.architectures = [arch]
    config.save_pretrained(folder)
    save_file({"x": torch.zeros(1)}, folder / "model.safetensors")
    return folder


def test_local_hf_folder(tmp_path):
    source = resolve_model_source(str(_hf_folder(tmp_path)))
    assert source.format == "safetensors" and source.path == tmp_path.resolve()
    assert source.hf_config.architectures == ["Qwen2ForCausalLM"]
    assert source.hf_config.hidden_size == 32


def test_folder_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        resolve_model_source(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_source(str(empty))
    for name in ("a.gguf", "b.gguf"):
        (empty / name).write_bytes(b"")
    with pytest.raises(ValueError, match="2 .gguf files"):
        resolve_model_source(str(empty))


def test_gguf_file_and_folder_with_one_gguf(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(cfg_mod, "_gguf_config", lambda path: seen.append(path) or "CFG")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    for arg in (str(gguf), str(tmp_path)):
        source = resolve_model_source(arg)
        assert (source.format, source.path, source.hf_config) == ("gguf", gguf.resolve(), "CFG")
    assert seen == [gguf.resolve()] * 2
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model_source(str(tmp_path / "weights.bin"))


@pytest.mark.parametrize("model", ["./nope", "/abs/nope", "dir/sub/nope", "nope.gguf"])
def test_missing_local_path(model):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_source(model)


def test_invalid_model_argument():
    with pytest.raises(ValueError, match="model must be"):
        resolve_model_source("  ")


def test_hub_name_uses_cache_then_downloads(tmp_path, monkeypatch):
    calls = []
    folder = _hf_folder(tmp_path)

    def fake_snapshot(repo_id, revision=None, allow_patterns=None, local_files_only=False):
        calls.append((repo_id, revision, local_files_only))
        assert "*.safetensors" in allow_patterns and "*.json" in allow_patterns
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    source = resolve_model_source("org/tiny-model", revision="main")
    assert source.path == folder and source.format == "safetensors"
    assert calls == [("org/tiny-model", "main", True), ("org/tiny-model", "main", False)]


def test_hub_offline_is_a_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match="could not be downloaded.*offline"):
        resolve_model_source("org/absent-model")
