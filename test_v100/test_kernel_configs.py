"""Tuned kernel configs: file naming, nearest-batch lookup, user override, warning, writer."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from vllm_volta import kernel_configs as kc
from vllm_volta.logger import ROOT_LOGGER_NAME, reset_log_once

OP = "paged_attention_decode"
SHAPE = dict(head_size=128, num_kv_heads=8, dtype=torch.float16)
FILE = "op=paged_attention_decode,head_size=128,num_kv_heads=8,dtype=float16,device_name=NVIDIA_H200.json"
TABLE = {1: {"num_splits": 8, "warps": 4}, 8: {"num_splits": 4, "warps": 4},
         64: {"num_splits": 2, "warps": 8}, 256: {"num_splits": 1, "warps": 8}}
DEFAULT = {"num_splits": 1, "warps": 4}


@pytest.fixture(autouse=True)
def dirs(monkeypatch, tmp_path):
    """Shipped folder and user folder both in tmp; caches and log-once state reset."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(kc, "SHIPPED_CONFIG_DIR", shipped)
    monkeypatch.delenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", raising=False)
    kc.clear_kernel_config_cache()
    reset_log_once()
    yield shipped, user
    kc.clear_kernel_config_cache()


@pytest.fixture
def warnings_seen(caplog):
    root = logging.getLogger(ROOT_LOGGER_NAME)
    root.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger=ROOT_LOGGER_NAME)
    yield lambda: [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    root.removeHandler(caplog.handler)


def _get(batch, **kw):
    return kc.get_kernel_config(OP, batch, default=DEFAULT, device_name="NVIDIA H200", **SHAPE, **kw)


def _nearest_reference(table, batch):
    return table[min(table, key=lambda size: (abs(size - batch), size))]


def test_file_name():
    assert kc.kernel_config_file_name(OP, device_name="NVIDIA H200", **SHAPE) == FILE
    assert kc.normalize_device_name(" NVIDIA H100 80GB HBM3 ") == "NVIDIA_H100_80GB_HBM3"
    assert kc.normalize_device_name("Tesla V100-SXM2-16GB") == "Tesla_V100-SXM2-16GB"
    assert kc.normalize_device_name("weird/name:x") == "weird_name_x"
    assert kc.kernel_config_file_name("rms_norm", device_name="cpu", hidden=4096, dtype="bfloat16") \
        == "op=rms_norm,hidden=4096,dtype=bfloat16,device_name=cpu.json"


@pytest.mark.parametrize("op,shape,device", [
    ("", {}, "x"), ("a,b", {}, "x"), ("op", {"k": "a=b"}, "x"), ("op", {"k": "a/b"}, "x"),
    ("op", {"k-2": "x"}, "x"), ("op", {}, "  "), ("op", {"k": [1, 2]}, "x"),
])
def test_file_name_rejects_unsafe_parts(op, shape, device):
    with pytest.raises(ValueError):
        kc.kernel_config_file_name(op, device_name=device, **shape)


def test_write_then_nearest_lookup(dirs):
    shipped, _ = dirs
    path = kc.write_kernel_config(OP, TABLE, device_name="NVIDIA H200", **SHAPE)
    assert path == shipped / FILE
    on_disk = json.loads(path.read_text())
    assert list(on_disk) == ["1", "8", "64", "256"] and on_disk["64"] == TABLE[64]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
    assert [p.name for p in shipped.iterdir()] == [FILE]  # no temporary file left behind
    for batch in [1, 2, 4, 5, 7, 8, 30, 36, 37, 63, 64, 100, 160, 161, 256, 1000, 10**6]:
        assert _get(batch) == _nearest_reference(TABLE, batch), batch
    assert _get(36) == TABLE[8] and _get(4) == TABLE[1]  # ties go to the smaller batch size
    assert kc.load_kernel_config_table(OP, device_name="NVIDIA H200", **SHAPE) == TABLE


def test_user_dir_overrides_shipped(dirs, monkeypatch):
    shipped, user = dirs
    kc.write_kernel_config(OP, TABLE, device_name="NVIDIA H200", **SHAPE)
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(user))
    assert _get(64) == TABLE[64]  # user folder has nothing yet: shipped file applies
    user_path = kc.write_kernel_config(OP, {"16": {"num_splits": 3}}, device_name="NVIDIA H200",
                                       **SHAPE)
    assert user_path == user / FILE  # the writer defaults to the user folder when it is set
    assert _get(64) == {"num_splits": 3}
    assert _get(1) == {"num_splits": 3}
    monkeypatch.delenv("VLLM_VOLTA_KERNEL_CONFIG_DIR")
    assert _get(64) == TABLE[64]


def test_missing_file_warns_once_and_returns_default(dirs, warnings_seen):
    first = _get(4)
    assert first == DEFAULT and first is not DEFAULT
    first["num_splits"] = 99  # the caller's default is not shared with later calls
    assert _get(16) == DEFAULT and DEFAULT["num_splits"] == 1
    warned = warnings_seen()
    assert len(warned) == 1
    assert FILE in warned[0] and str(dirs[0]) in warned[0] and "benchmarks/kernels/" in warned[0]
    # Another shape is another file: its own single warning.
    kc.get_kernel_config(OP, 1, default=DEFAULT, device_name="NVIDIA H200", head_size=64,
                         num_kv_heads=8, dtype=torch.float16)
    assert len(warnings_seen()) == 2


def test_results_are_copies(dirs):
    kc.write_kernel_config(OP, TABLE, device_name="NVIDIA H200", **SHAPE)
    _get(64)["warps"] = 1
    assert _get(64) == TABLE[64]


def test_cache_and_clear(dirs):
    shipped, _ = dirs
    kc.write_kernel_config(OP, TABLE, device_name="NVIDIA H200", **SHAPE)
    assert _get(1) == TABLE[1]
    (shipped / FILE).write_text(json.dumps({"1": {"num_splits": 42}}))  # edited by hand
    assert _get(1) == TABLE[1]  # cached
    kc.clear_kernel_config_cache()
    assert _get(1) == {"num_splits": 42}


def test_default_device_name_is_the_current_platform(dirs):
    from vllm_volta.platforms import current_platform

    name = kc.normalize_device_name(current_platform.get_device_name())
    path = kc.write_kernel_config("rms_norm", {4: {"block": 256}}, hidden=4096)
    assert path.name == f"op=rms_norm,hidden=4096,device_name={name}.json"
    assert kc.get_kernel_config("rms_norm", 3, default={}, hidden=4096) == {"block": 256}


@pytest.mark.parametrize("content,match", [
    ("not json", "not valid JSON"), ("[]", "non-empty mapping"), ("{}", "non-empty mapping"),
    ('{"0": {}}', "positive integers"), ('{"abc": {}}', "positive integers"),
    ('{"1.5": {}}', "positive integers"), ('{"1": 3}', "mapping of launch params"),
    ('{"4": {}, "04": {}}', "positive integers"),
])
def test_malformed_file_is_a_clear_error(dirs, content, match):
    shipped, _ = dirs
    shipped.mkdir()
    (shipped / FILE).write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        _get(1)
    assert FILE in str(info.value)


@pytest.mark.parametrize("configs", [{}, {0: {}}, {-1: {}}, {"x": {}}, {1: 5}, {1: {}, "1": {}},
                                     {True: {}}])
def test_writer_rejects_bad_tables(dirs, configs):
    with pytest.raises(ValueError):
        kc.write_kernel_config(OP, configs, device_name="NVIDIA H200", **SHAPE)
    assert not dirs[0].exists() or not list(dirs[0].iterdir())


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_bad_batch_size(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        _get(bad)
