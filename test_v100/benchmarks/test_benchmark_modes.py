"""benchmarks/benchmark_modes.py: two processes, the override only on the Volta side."""
from __future__ import annotations

import json

import pytest

from benchmarks import benchmark_modes


def test_native_and_volta_sides(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "8.0")  # must not leak into native
    # The engine's side: its processes log while they run, and stdout must stay one JSON document.
    result = benchmark_modes.main(["--config", "tiny-llama", "--input-len", "6", "--output-len", "3",
                                   "--num-prompts", "2"])
    captured = capsys.readouterr()
    assert json.loads(captured.out) == result
    native, volta = result["native"], result["volta"]
    assert native["device"]["VLLM_VOLTA_DEVICE_CAPABILITY"] is None
    assert volta["device"]["VLLM_VOLTA_DEVICE_CAPABILITY"] == "7.0"
    assert native["total_output_tokens"] == volta["total_output_tokens"] == 6
    for key, value in result["volta_vs_native"].items():
        assert value == pytest.approx(volta[key] / native[key])
    assert result["volta_extension_is_adapter"] == volta["device"]["extension"].get("v100_adapter")
    # The log's summary line carries both sides' figures and the ratios.
    summary = [line for line in captured.err.splitlines() if line.startswith("[bench] summary: ")]
    assert len(summary) == 1
    assert f"output_tokens_per_second {native['output_tokens_per_second']:.6g}" in summary[0]
    assert f"output_tokens_per_second {volta['output_tokens_per_second']:.6g}" in summary[0]
    ratio = result["volta_vs_native"]["output_tokens_per_second"]
    assert "volta vs native: requests_per_second" in summary[0] and f"{ratio:.3f}" in summary[0]


def test_headline_of_latency_and_throughput_sides():
    side = {"decode_time_per_token": 0.0041672, "roofline": {"fraction_of_roofline": 0.86007}}
    assert benchmark_modes.headline(side) == "decode_time_per_token 0.0041672, 86.0% of roofline"
    side = {"output_tokens_per_second": 41499.2, "ratio_vs_hf": {"output_tokens_per_second": 10.81}}
    assert benchmark_modes.headline(side) == "output_tokens_per_second 41499.2, 10.81x transformers"


def test_rejects_a_tree_without_benchmarks(tmp_path):
    with pytest.raises(ValueError, match="--volta-tree"):
        benchmark_modes.parse_args(["--volta-tree", str(tmp_path)])
