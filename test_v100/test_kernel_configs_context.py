"""Tuned kernel configs keyed by batch size and context length: nearest batch, then nearest
context on a log scale; files with plain batch keys keep loading and mean "any context"."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vllm_volta import kernel_configs as kc

OP = "paged_attention_decode"
SHAPE = dict(head_size=128, num_kv_heads=4, dtype=torch.float16)
DEVICE = "NVIDIA H200"
DEFAULT = {"partition_size": 1, "num_threads": 1}


def _cfg(p: int) -> dict[str, int]:
    return {"partition_size": p, "num_threads": 128}


# Batch 1 and 8 tuned at four contexts, batch 64 at two; batch 256 has one any-context entry.
TABLE = {(1, 1024): _cfg(128), (1, 4096): _cfg(144), (1, 32768): _cfg(256), (1, 131072): _cfg(512),
         (8, 1024): _cfg(160), (8, 4096): _cfg(176), (8, 32768): _cfg(192), (8, 131072): _cfg(208),
         (64, 4096): _cfg(224), (64, 32768): _cfg(240), (256, None): _cfg(1024)}


@pytest.fixture(autouse=True)
def dirs(monkeypatch, tmp_path):
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(kc, "SHIPPED_CONFIG_DIR", shipped)
    monkeypatch.delenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", raising=False)
    kc.clear_kernel_config_cache()
    yield shipped
    kc.clear_kernel_config_cache()


def _get(batch: int, context: int | None) -> dict:
    return kc.get_kernel_config(OP, batch, default=DEFAULT, device_name=DEVICE, context_len=context, **SHAPE)


def _reference(table: dict, batch: int, context: int | None) -> dict:
    """Brute force: nearest batch (smaller on a tie), then its nearest context by |log ratio|
    (smaller on a tie); no context: its any-context entry, else its smallest context's."""
    batches = sorted({b for b, _ in table})
    b = min(batches, key=lambda x: (abs(x - batch), x))
    entries = {c: v for (bb, c), v in table.items() if bb == b}
    with_ctx = sorted(c for c in entries if c is not None)
    if context is None or not with_ctx:
        return entries[None] if None in entries else entries[with_ctx[0]]
    return entries[min(with_ctx, key=lambda c: (round(abs(math.log2(c / context)), 9), c))]


def test_written_keys_are_batch_comma_context(dirs):
    path = kc.write_kernel_config(OP, TABLE, device_name=DEVICE, **SHAPE)
    data = json.loads(path.read_text())
    assert list(data)[:4] == ["1,1024", "1,4096", "1,32768", "1,131072"]
    assert data["256"] == _cfg(1024) and data["64,32768"] == _cfg(240)


@pytest.mark.parametrize("batch", [1, 2, 4, 5, 8, 20, 36, 40, 64, 100, 160, 161, 256, 1000])
@pytest.mark.parametrize("context", [None, 1, 700, 1024, 2048, 2049, 5000, 8192, 11585, 11586, 24000,
                                     65536, 65537, 131072, 500_000])
def test_nearest_batch_then_nearest_log_context(batch, context):
    kc.write_kernel_config(OP, TABLE, device_name=DEVICE, **SHAPE)
    assert _get(batch, context) == _reference(TABLE, batch, context)


def test_log_scale_examples():
    kc.write_kernel_config(OP, TABLE, device_name=DEVICE, **SHAPE)
    assert _get(1, 24000)["partition_size"] == 256  # nearer 32k than 4k on a log scale (not linearly)
    assert _get(1, 2048)["partition_size"] == 128  # 2048 is the log midpoint of 1k and 4k: the smaller
    assert _get(1, 2049)["partition_size"] == 144
    assert _get(1, 65536)["partition_size"] == 256  # the midpoint of 32k and 128k
    assert _get(36, 131072)["partition_size"] == 208  # 36: equidistant from 8 and 64 -> the smaller


def test_batch_40_picks_batch_64s_contexts():
    kc.write_kernel_config(OP, TABLE, device_name=DEVICE, **SHAPE)
    assert _get(40, 131072) == _cfg(240) and _get(40, 1000) == _cfg(224)


def test_old_files_mean_any_context(dirs):
    dirs.mkdir()
    old = {"1": _cfg(128), "16": _cfg(1024)}
    (dirs / kc.kernel_config_file_name(OP, device_name=DEVICE, **SHAPE)).write_text(json.dumps(old))
    for context in (None, 1, 4096, 131072):
        assert _get(1, context) == _cfg(128) and _get(20, context) == _cfg(1024)
    assert kc.load_kernel_config_table(OP, device_name=DEVICE, **SHAPE) == {1: _cfg(128), 16: _cfg(1024)}
    assert kc.load_kernel_config_entries(OP, device_name=DEVICE, **SHAPE) == {(1, None): _cfg(128),
                                                                             (16, None): _cfg(1024)}


def test_mixed_file_context_entries_win_when_a_context_is_given():
    table = {(4, None): _cfg(64), (4, 8192): _cfg(512)}
    kc.write_kernel_config(OP, table, device_name=DEVICE, **SHAPE)
    assert _get(4, None) == _cfg(64)
    assert _get(4, 100) == _cfg(512)
    assert kc.load_kernel_config_entries(OP, device_name=DEVICE, **SHAPE) == table


def test_entries_round_trip():
    kc.write_kernel_config(OP, TABLE, device_name=DEVICE, **SHAPE)
    assert kc.load_kernel_config_entries(OP, device_name=DEVICE, **SHAPE) == TABLE
    # Per batch without a context: the any-context entry, else the shortest context's.
    assert kc.load_kernel_config_table(OP, device_name=DEVICE, **SHAPE) == {
        1: _cfg(128), 8: _cfg(160), 64: _cfg(224), 256: _cfg(1024)}


@pytest.mark.parametrize("key", ["1,0", "1,-4", "1,2,3", "1,", ",4096", "1,4k", "0,4096"])
def test_bad_context_keys_are_clear_errors(dirs, key):
    dirs.mkdir()
    (dirs / kc.kernel_config_file_name(OP, device_name=DEVICE, **SHAPE)).write_text(json.dumps({key: _cfg(64)}))
    with pytest.raises(ValueError, match="<batch>,<context>"):
        _get(1, 1)


def test_duplicate_keys_rejected_by_the_writer():
    with pytest.raises(ValueError, match="duplicate"):
        kc.write_kernel_config(OP, {(1, 4096): _cfg(64), "1,4096": _cfg(128)}, device_name=DEVICE, **SHAPE)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "4096"])
def test_bad_context_len_argument(bad):
    with pytest.raises(ValueError, match="context_len must be a positive integer"):
        _get(1, bad)


def test_w8a8_files_reject_context_keys(dirs):
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
           "num_warps": 4, "num_stages": 3}
    with pytest.raises(ValueError, match="batch size only"):
        kc.write_w8a8_block_fp8_configs({(1, 4096): cfg}, 256, 512, [128, 128], device_name=DEVICE)
