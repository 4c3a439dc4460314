"""benchmarks/gpu_clocks.py: nvidia-smi samples summarized, the sampler's process, --gpu-stats."""
from __future__ import annotations

import stat
import time

import pytest
import torch

from benchmarks import benchmark_throughput, gpu_clocks

TINY = ["--config", "tiny-llama", "--input-len", "12", "--output-len", "5", "--num-prompts", "6"]


def test_summarize_clocks_power_and_throttle_reasons():
    lines = ["1980, 120.5, 0x0000000000000000",
             "1500, 690.0, 0x0000000000000004",
             "1200, [N/A], 0x000000000000000C",  # power cap + hardware slowdown
             "", "garbage line"]
    s = gpu_clocks.summarize(lines, period_ms=250)
    assert s["samples"] == 3 and s["period_ms"] == 250
    assert s["sm_clock_mhz"] == {"min": 1200.0, "mean": pytest.approx(4680 / 3), "max": 1980.0}
    assert s["power_w"] == {"mean": pytest.approx(405.25), "max": 690.0}
    assert s["throttle_reasons"] == {"sw_power_cap": pytest.approx(2 / 3), "hw_slowdown": pytest.approx(1 / 3)}


def test_describe():
    s = gpu_clocks.summarize(["1500, 600.4, 0x4", "1700, 640.0, 0x0"], period_ms=200)
    assert gpu_clocks.describe(s) == "SM clock 1500-1700 MHz (mean 1600), power mean 620 W, sw_power_cap in 50% of samples"
    assert gpu_clocks.describe({"samples": 0, "error": "nvidia-smi could not run: x"}) == "nvidia-smi could not run: x"


def test_summarize_without_samples():
    assert gpu_clocks.summarize(["No devices were found"], period_ms=200) == {"samples": 0, "period_ms": 200}


def fake_nvidia_smi(tmp_path, monkeypatch, body: str):
    """A stand-in nvidia-smi that records its arguments and runs `body`."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(gpu_clocks, "NVIDIA_SMI", str(script))
    return tmp_path / "args"


LOOPING = """trap 'echo "1410, 650.0, 0x0000000000000004"; exit 0' TERM
while true; do echo "1500, 600.0, 0x0000000000000004"; sleep 0.05; done"""


def test_sampler_runs_nvidia_smi_beside_the_block(tmp_path, monkeypatch):
    args = fake_nvidia_smi(tmp_path, monkeypatch, LOOPING)
    with gpu_clocks.GpuClockSampler("GPU-1234", period_ms=50) as sampler:
        time.sleep(0.3)
    s = sampler.summary
    assert s["samples"] >= 2 and 1410 <= s["sm_clock_mhz"]["min"] <= s["sm_clock_mhz"]["max"] <= 1500
    assert s["throttle_reasons"] == {"sw_power_cap": 1.0}
    recorded = args.read_text().split()
    assert f"--query-gpu={gpu_clocks.QUERY}" in recorded
    assert "--id=GPU-1234" in recorded and "--loop-ms=50" in recorded


def test_sampler_reports_why_it_has_no_samples(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, 'echo "No devices were found"; exit 6')
    with gpu_clocks.GpuClockSampler("0") as sampler:
        time.sleep(0.1)
    assert sampler.summary["samples"] == 0 and "No devices were found" in sampler.summary["error"]
    monkeypatch.setattr(gpu_clocks, "NVIDIA_SMI", str(tmp_path / "missing"))
    with gpu_clocks.GpuClockSampler("0") as sampler:
        pass
    assert "could not run" in sampler.summary["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_gpu_stats_needs_a_gpu():
    with pytest.raises(ValueError, match="--gpu-stats samples an NVIDIA GPU"):
        benchmark_throughput.parse_args([*TINY, "--gpu-stats"])


def test_throughput_reports_gpu_stats_per_backend(tmp_path, monkeypatch):
    """The whole --gpu-stats path, with a stand-in nvidia-smi and GPU name where there is no GPU."""
    fake_nvidia_smi(tmp_path, monkeypatch, LOOPING)
    monkeypatch.setattr(gpu_clocks, "has_gpu", lambda: True)
    monkeypatch.setattr(gpu_clocks, "nvidia_smi_id", lambda device: "GPU-fake")
    result = benchmark_throughput.main([*TINY, "--gpu-stats", "--compare-hf", "--hf-batch-size", "3"])
    for backend in ("vllm-volta", "hf"):
        stats = result["results"][backend]["gpu_stats"]
        assert stats["samples"] >= 1 and stats["throttle_reasons"] == {"sw_power_cap": 1.0}
    assert "gpu_stats" not in benchmark_throughput.main(TINY)["results"]["vllm-volta"]
