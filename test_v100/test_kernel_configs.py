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
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
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


# --- W8A8 block-FP8 GEMM configs under vLLM's file names ------------------------------------------

FP8_FILE = "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"
H100 = "NVIDIA H100 80GB HBM3"
VLLM_GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def _launch(i: int) -> dict:
    """A distinct valid launch config per batch size."""
    return {"BLOCK_SIZE_M": 16 * (1 + i % 4), "BLOCK_SIZE_N": 32 * (1 + i % 3), "BLOCK_SIZE_K": 128,
            "GROUP_SIZE_M": 1 + i, "num_warps": 4, "num_stages": 2 + i % 4}


FP8_TABLE = {m: _launch(i) for i, m in enumerate(VLLM_GRID)}


def _vllm_file(folder, table=FP8_TABLE, name=FP8_FILE):
    """A file as vLLM's tuner writes it: json.dump of {str(M): config}, indent 4."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({str(m): c for m, c in table.items()}, indent=4))


def _fp8(m, n=1536, k=7168, device=H100):
    return kc.get_w8a8_block_fp8_config(m, n, k, [128, 128], device_name=device)


def test_fp8_file_name_is_vllms():
    assert kc.w8a8_block_fp8_file_name(1536, 7168, (128, 128), device_name=H100) == FP8_FILE
    assert kc.w8a8_block_fp8_file_name(24576, 7168, [128, 128], device_name="NVIDIA B200") == \
        "N=24576,K=7168,device_name=NVIDIA_B200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert kc.w8a8_block_fp8_file_name(1536, 1536, [64, 32], device_name="AMD Instinct MI300X") == \
        "N=1536,K=1536,device_name=AMD_Instinct_MI300X,dtype=fp8_w8a8,block_shape=[64,32].json"
    assert kc.w8a8_block_fp8_file_name(1, 2, [3, 4], device_name="NVIDIA A100-SXM4-80GB").split(",")[2] == \
        "device_name=NVIDIA_A100-SXM4-80GB"
    for bad in [dict(n=0), dict(k=-1), dict(n=1.5), dict(block_shape=[0, 128]), dict(n=True)]:
        args = {"n": 1536, "k": 7168, "block_shape": [128, 128]} | bad
        with pytest.raises(ValueError, match="must be a positive integer"):
            kc.w8a8_block_fp8_file_name(**args, device_name=H100)


def test_fp8_shipped_file_nearest_batch(dirs):
    shipped, _ = dirs
    _vllm_file(shipped)
    for m in [1, 3, 5, 6, 7, 20, 28, 37, 40, 56, 80, 100, 112, 200, 300, 384, 385, 1280, 2050, 3584, 5000, 10**6]:
        ref = FP8_TABLE[min(FP8_TABLE, key=lambda x: abs(x - m))]  # vLLM's rule, keys in file order
        assert _fp8(m) == ref, m
    assert _fp8(37) == FP8_TABLE[32] and _fp8(2050) == FP8_TABLE[2048]  # the seed's examples
    assert _fp8(3) == FP8_TABLE[2] and _fp8(384) == FP8_TABLE[256]  # ties: the smaller batch size
    assert kc.get_w8a8_block_fp8_configs(1536, 7168, [128, 128], device_name=H100) == FP8_TABLE
    _fp8(1)["BLOCK_SIZE_M"] = 1  # results are copies
    assert _fp8(1) == FP8_TABLE[1]


def test_fp8_missing_file_default_and_one_warning(dirs, warnings_seen):
    default = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
               "num_warps": 4, "num_stages": 2}
    assert _fp8(1) == default and _fp8(4096) == default
    assert kc.get_w8a8_block_fp8_configs(1536, 7168, [128, 128], device_name=H100) is None
    warned = warnings_seen()
    assert len(warned) == 1
    assert warned[0].startswith("Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal!")
    assert FP8_FILE in warned[0] and str(dirs[0]) in warned[0]
    _fp8(1, n=4096)  # another shape: its own warning
    assert len(warnings_seen()) == 2
    assert kc.get_w8a8_block_fp8_config(5, 256, 512, [64, 64], device_name=H100)["BLOCK_SIZE_N"] == 64


def test_fp8_user_folders_override_shipped(dirs, monkeypatch, tmp_path):
    shipped, ours = dirs
    vllms = tmp_path / "vllm_tuned"
    _vllm_file(shipped)
    only_8 = {8: _launch(40)}
    _vllm_file(vllms, only_8)
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(vllms))
    assert _fp8(1) == only_8[8] and _fp8(4096) == only_8[8]  # vLLM's variable: the whole file wins
    only_64 = {64: _launch(41)}
    _vllm_file(ours, only_64)
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(ours))
    assert _fp8(1) == only_64[64]  # ours is searched first
    monkeypatch.delenv("VLLM_VOLTA_KERNEL_CONFIG_DIR")
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER")
    assert _fp8(1) == FP8_TABLE[1]
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path / "empty"))
    assert _fp8(1) == FP8_TABLE[1]  # a user folder without the file falls back to the shipped one


def test_fp8_device_name_normalised_and_defaults_to_platform(dirs):
    from vllm_volta.platforms import current_platform

    shipped, _ = dirs
    _vllm_file(shipped)
    assert _fp8(1, device="NVIDIA_H100_80GB_HBM3") == FP8_TABLE[1]  # already normalised: same file
    name = kc.normalize_device_name(current_platform.get_device_name())
    _vllm_file(shipped, {4: _launch(3)}, f"N=64,K=256,device_name={name},dtype=fp8_w8a8,block_shape=[128,128].json")
    assert kc.get_w8a8_block_fp8_config(2, 64, 256, [128, 128]) == _launch(3)


def test_fp8_writer_round_trip(dirs, monkeypatch, tmp_path):
    shipped, ours = dirs
    path = kc.write_w8a8_block_fp8_configs(FP8_TABLE, 1536, 7168, [128, 128], device_name=H100)
    assert path == shipped / FP8_FILE
    assert json.loads(path.read_text()) == {str(m): c for m, c in FP8_TABLE.items()}
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path / "v"))
    assert kc.write_w8a8_block_fp8_configs(FP8_TABLE, 8, 8, [128, 128], device_name=H100).parent == tmp_path / "v"
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(ours))
    assert kc.write_w8a8_block_fp8_configs(FP8_TABLE, 8, 8, [128, 128], device_name=H100).parent == ours
    assert _fp8(100, n=8, k=8) == FP8_TABLE[96]


@pytest.mark.parametrize("entry,match", [
    ({"BLOCK_SIZE_M": 64}, "missing"),
    (_launch(0) | {"num_warps": 0}, r"invalid \['num_warps'\]"),
    (_launch(0) | {"BLOCK_SIZE_K": 96}, "BLOCK_SIZE_K=96 must divide the quantization block's 128"),
])
def test_fp8_bad_files_are_clear_errors(dirs, entry, match):
    shipped, _ = dirs
    _vllm_file(shipped, {1: entry})
    with pytest.raises(ValueError, match=match) as info:
        _fp8(1)
    assert FP8_FILE in str(info.value)
    with pytest.raises(ValueError, match=match):
        kc.write_w8a8_block_fp8_configs({1: entry}, 1, 1, [128, 128], device_name=H100, directory=dirs[1])
    with pytest.raises(ValueError, match="M \\(batch rows\\) must be a positive integer"):
        _fp8(0)
