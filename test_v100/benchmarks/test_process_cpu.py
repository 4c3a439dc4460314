"""benchmarks/process_cpu.py: the server's CPU time, front end and engine core apart, read
from /proc for real processes (a busy child and an idle parent)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.process_cpu import ServerCpu, child_pids, cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")

# An idle parent whose child spins: like a front end waiting while its engine core works.
_PARENT = ("import subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
           "print(child.pid, flush=True)\n"
           "time.sleep(60)\n")


def test_cpu_seconds_of_this_process_grow_with_work():
    start = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - start >= 0.2
    assert cpu_seconds(2**22 + 12345) is None  # no such process


def test_front_end_and_engine_core_are_told_apart():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert child_pids(parent.pid) == [child]
        cpu = ServerCpu(parent.pid)
        time.sleep(1.0)
        out = cpu.delta(output_tokens=1000)
    finally:
        for pid in child_pids(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
    assert out["engine_core_cpu_s"] >= 0.5  # the spinning child, about 1 s
    assert out["frontend_cpu_s"] < 0.3  # the sleeping parent
    assert out["engine_core_cpu_us_per_output_token"] == pytest.approx(
        out["engine_core_cpu_s"] / 1000 * 1e6)
