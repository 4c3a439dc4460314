"""The GPU's SM clock, power draw and throttle reasons, sampled with nvidia-smi during a run.

An H200 runs the offline benchmark at its power cap: the SM clock moved between ~1.2 and
~2.0 GHz inside one run, with the software power cap as the active throttle reason. How fast a
run is depends on the clock it held, so ``--gpu-stats`` puts the clocks a run saw next to its
numbers.
"""
from __future__ import annotations

import statistics
import subprocess
import tempfile
from typing import Any, Iterable

import torch

NVIDIA_SMI = "nvidia-smi"
QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"
# NVML's clocks throttle (event) reason bits.
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


def has_gpu() -> bool:
    """Whether there is a CUDA device to sample (checked before any engine starts)."""
    return torch.cuda.is_available()


def nvidia_smi_id(device: torch.device | str | None) -> str | None:
    """How nvidia-smi names the CUDA device `device` (None: the current one) by its UUID,
    which CUDA_VISIBLE_DEVICES does not renumber; None when it is not a CUDA device."""
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device.index or 0)
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        return str(device.index or 0)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _number(field: str) -> float | None:
    try:
        return float(field)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def summarize(lines: Iterable[str], period_ms: int) -> dict[str, Any]:
    """Summary of nvidia-smi CSV lines "clock MHz, power W, reasons bitmask" (no units): the
    SM clock's min / mean / max, mean and max power, and per active throttle reason the
    fraction of samples that showed it."""
    clocks, power, masks = [], [], []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        clock, watts = _number(fields[0]), _number(fields[1])
        if clock is not None:
            clocks.append(clock)
        if watts is not None:
            power.append(watts)
        try:
            masks.append(int(fields[2], 16))
        except ValueError:
            pass
    out: dict[str, Any] = {"samples": len(clocks), "period_ms": period_ms}
    if clocks:
        out["sm_clock_mhz"] = {"min": min(clocks), "mean": statistics.fmean(clocks), "max": max(clocks)}
    if power:
        out["power_w"] = {"mean": statistics.fmean(power), "max": max(power)}
    if masks:
        out["throttle_reasons"] = {name: sum(1 for m in masks if m & bit) / len(masks)
                                   for bit, name in THROTTLE_REASONS.items() if any(m & bit for m in masks)}
    return out


def describe(summary: dict[str, Any]) -> str:
    """One log line for a summary."""
    if "sm_clock_mhz" not in summary:
        return summary.get("error", "no samples")
    c = summary["sm_clock_mhz"]
    parts = [f"SM clock {c['min']:.0f}-{c['max']:.0f} MHz (mean {c['mean']:.0f})"]
    if "power_w" in summary:
        parts.append(f"power mean {summary['power_w']['mean']:.0f} W")
    parts += [f"{name} in {share:.0%} of samples" for name, share in summary.get("throttle_reasons", {}).items()]
    return ", ".join(parts)


class GpuClockSampler:
    """``with GpuClockSampler(gpu_id) as s: ...`` then ``s.summary`` (see summarize()). nvidia-smi
    runs beside the block, writing to a temporary file (a pipe could fill and stall it). When
    nvidia-smi cannot run, the summary says why instead of failing the benchmark."""

    def __init__(self, gpu_id: str, period_ms: int = 200) -> None:
        self.gpu_id = gpu_id
        self.period_ms = period_ms
        self.summary: dict[str, Any] = {}
        self._proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> GpuClockSampler:
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [NVIDIA_SMI, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
               f"--loop-ms={self.period_ms}", f"--id={self.gpu_id}"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            self.summary = {"error": f"{NVIDIA_SMI} could not run: {e}"}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._log.seek(0)
            text = self._log.read()
            self.summary = summarize(text.splitlines(), self.period_ms)
            if not self.summary["samples"]:
                self.summary["error"] = f"{NVIDIA_SMI} gave no samples: {text.strip()[:200]!r}"
        self._log.close()
