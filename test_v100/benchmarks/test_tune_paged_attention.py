"""The paged-decode tuner on CPU with mocked timings: the grid of points, the layouts list, the
files it writes (keys "<batch>,<context>", the fastest candidate per point), --merge, skips."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks.kernels.paged_attention_layouts import MODEL_LAYOUTS, resolve_layouts
from benchmarks.kernels.tune_paged_attention import (QUICK_CANDIDATES, candidates, parse_args, run)
from vllm_volta import kernel_configs as kc

DEVICE = "Test GPU"


iters_seen: list[tuple[int, int]] = []


def _fake_timer(calls):
    """Seconds that make the best partition ~ context / 8 per batch-size doubling (a known argmin),
    192 threads a little faster than 128 at 1024-token partitions only."""
    def timer(sets, shape, launch, device):
        batch = sets[0]["query"].shape[0]
        calls.append((batch, shape.max_seq_len, launch["partition_size"], launch["num_threads"], len(sets)))
        iters_seen.append((shape.iters, len(sets)))
        want = max(32, min(1024, shape.max_seq_len // 8 * batch))
        bonus = 0.01 if (launch["partition_size"] == 1024 and launch["num_threads"] == 192) else 0.0
        return 1.0 + abs(math.log2(launch["partition_size"] / want)) - bonus + launch["num_threads"] * 1e-6
    return timer


def _expected(batch, context, pool):
    want = max(32, min(1024, context // 8 * batch))
    return min(pool, key=lambda c: (abs(math.log2(c["partition_size"] / want))
                                    - (0.01 if c == {"partition_size": 1024, "num_threads": 192} else 0)
                                    + c["num_threads"] * 1e-6))


@pytest.fixture(autouse=True)
def _clean_cache():
    kc.clear_kernel_config_cache()
    yield
    kc.clear_kernel_config_cache()


def _file(tmp_path, head_size, kv, dtype="float16"):
    return tmp_path / (f"op=paged_attention_decode,head_size={head_size},num_kv_heads={kv},dtype={dtype},"
                       "device_name=Test_GPU.json")


def test_full_sweep_writes_the_fastest_launch_per_batch_and_context(tmp_path):
    args = parse_args(["--num-heads", "8", "--num-kv-heads", "2", "--head-size", "64", "--batch-sizes", "1", "2",
                       "--context-lens", "64", "256", "--iters", "2", "--working-set-mib", "1",
                       "--output-dir", str(tmp_path)])
    calls = []
    out = run(args, timer=_fake_timer(calls), device=torch.device("cpu"), device_name=DEVICE)
    data = json.loads(_file(tmp_path, 64, 2).read_text())
    assert sorted(data) == ["1,256", "1,64", "2,256", "2,64"]
    pool = candidates(args, {"partition_size": 0, "num_threads": 0})[:-1]  # the full grid
    assert len(pool) == 30
    for key, launch in data.items():
        batch, context = map(int, key.split(","))
        assert launch == _expected(batch, context, pool)
    # Each point timed every candidate (plus the default when it is not among them) on caches
    # rotated to reach the working set.
    assert {(b, c) for b, c, *_ in calls} == {(1, 64), (1, 256), (2, 64), (2, 256)}
    assert all(n_sets > 1 for *_, n_sets in calls)
    assert all(shape_iters >= n_sets for shape_iters, n_sets in iters_seen)
    assert out["tables"][0]["config_file"] == str(_file(tmp_path, 64, 2))


def test_lookup_reads_the_tuned_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    args = parse_args(["--num-heads", "4", "--num-kv-heads", "4", "--head-size", "64", "--batch-sizes", "1",
                       "--context-lens", "32", "512", "--iters", "1", "--working-set-mib", "1", "--quick"])
    run(args, timer=_fake_timer([]), device=torch.device("cpu"), device_name=DEVICE)
    pool = [{"partition_size": p, "num_threads": t} for p, t in QUICK_CANDIDATES]
    for context, tuned in ((40, 32), (400, 512)):
        got = kc.get_kernel_config("paged_attention_decode", 1, default={}, device_name=DEVICE,
                                   context_len=context, head_size=64, num_kv_heads=4, dtype=torch.float16)
        assert got == _expected(1, tuned, pool + [got])


def test_quick_mode_over_all_layouts_writes_one_file_per_head_and_kv_layout(tmp_path):
    args = parse_args(["--quick", "--layouts", "all", "--dtypes", "half", "bfloat16", "--batch-sizes", "1",
                       "--context-lens", "32", "--working-set-mib", "1", "--output-dir", str(tmp_path)])
    assert args.iters == 10
    calls = []
    out = run(args, timer=_fake_timer(calls), device=torch.device("cpu"), device_name=DEVICE)
    keys = {(lay.head_size, lay.num_kv_heads) for lay in resolve_layouts(["all"], [1, 2])}
    assert {(128, 4), (128, 8), (64, 3), (128, 2), (256, 8), (512, 2), (128, 1), (256, 4), (512, 1),
            (512, 4)} == keys
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 2 * len(keys) == len(out["tables"])
    for head_size, kv in keys:
        for dtype in ("float16", "bfloat16"):
            assert list(json.loads(_file(tmp_path, head_size, kv, dtype).read_text())) == ["1,32"]
    # Few candidates: the quick list plus at most the default launch, per point.
    assert len(calls) <= len(written) * (len(QUICK_CANDIDATES) + 1)


def test_quick_defaults_and_points_over_the_cache_limit_are_skipped(tmp_path):
    args = parse_args(["--quick", "--num-heads", "8", "--num-kv-heads", "8", "--head-size", "128",
                       "--max-cache-gib", "0.001"])
    assert args.batch_sizes == [1, 4, 8, 16, 64, 256] and args.context_lens == [1024, 4096, 32768, 131072]
    args.batch_sizes, args.context_lens, args.output_dir = [1, 2], [64, 1024], str(tmp_path)
    # 1 MiB limit: 2 x 64 x 8 x 128 x 2 bytes = 256 KiB (batch 1) fits, 1024 tokens (4 MiB) do not.
    out = run(args, timer=_fake_timer([]), device=torch.device("cpu"), device_name=DEVICE)
    assert sorted(json.loads(_file(tmp_path, 128, 8).read_text())) == ["1,64", "2,64"]
    skipped = [r for r in out["tables"][0]["results"] if "skipped" in r]
    assert {(r["batch_size"], r["context_len"]) for r in skipped} == {(1, 1024), (2, 1024)}


def test_merge_keeps_the_points_not_retuned(tmp_path, monkeypatch):
    shape = dict(head_size=64, num_kv_heads=2, dtype=torch.float16)
    old = {(1, None): {"partition_size": 64, "num_threads": 64}, (1, 64): {"partition_size": 32, "num_threads": 64},
           (8, 4096): {"partition_size": 1024, "num_threads": 64}}
    kc.write_kernel_config("paged_attention_decode", old, device_name=DEVICE, directory=tmp_path, **shape)
    args = parse_args(["--num-heads", "8", "--num-kv-heads", "2", "--head-size", "64", "--batch-sizes", "1",
                       "--context-lens", "64", "--iters", "1", "--working-set-mib", "1", "--quick", "--merge",
                       "--output-dir", str(tmp_path)])
    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))  # the table in effect
    run(args, timer=_fake_timer([]), device=torch.device("cpu"), device_name=DEVICE)
    data = json.loads(_file(tmp_path, 64, 2).read_text())
    assert data["1"] == old[(1, None)] and data["8,4096"] == old[(8, 4096)]
    assert data["1,64"] != old[(1, 64)]  # retuned


@pytest.mark.parametrize("argv,match", [(["--batch-sizes", "0"], "--batch-sizes"),
                                        (["--context-lens", "-1"], "--context-lens"),
                                        (["--layouts", "nope"], "unknown"),
                                        (["--dtypes", "int3"], "int3"),
                                        (["--max-cache-gib", "0"], "--max-cache-gib")])
def test_bad_arguments(argv, match):
    with pytest.raises(ValueError, match=match):
        parse_args(argv)


def test_layout_split_and_names():
    assert MODEL_LAYOUTS["qwen2.5-7b"].split(2).num_kv_heads == 2
    assert MODEL_LAYOUTS["smollm2-135m"].split(2) is None  # 3 KV heads do not split in two
    assert resolve_layouts(["llama-3.1-8b", "qwen3-8b"], [1]) == [MODEL_LAYOUTS["llama-3.1-8b"]]
