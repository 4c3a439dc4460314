"""benchmarks/benchmark_modes.py: two processes, the override only on the Volta side."""
from __future__ import annotations

import json

import pytest

from benchmarks import benchmark_modes


def test_native_and_volta_sides(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "8.0")  # must not leak into native
    result = benchmark_modes.main(["--config", "tiny-llama", "--backend", "hf", "--input-len",
                                   "6", "--output-len", "3", "--num-prompts", "2"])
    assert json.loads(capsys.readouterr().out) == result
    native, volta = result["native"], result["volta"]
    assert native["device"]["VLLM_VOLTA_DEVICE_CAPABILITY"] is None
    assert volta["device"]["VLLM_VOLTA_DEVICE_CAPABILITY"] == "7.0"
    assert native["total_output_tokens"] == volta["total_output_tokens"] == 6
    for key, value in result["volta_vs_native"].items():
        assert value == pytest.approx(volta[key] / native[key])
    assert result["volta_extension_is_adapter"] == volta["device"]["extension"].get("v100_adapter")


def test_rejects_a_tree_without_benchmarks(tmp_path):
    with pytest.raises(ValueError, match="--volta-tree"):
        benchmark_modes.parse_args(["--volta-tree", str(tmp_path)])
