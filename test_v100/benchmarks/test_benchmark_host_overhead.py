"""benchmark_host_overhead: real engine steps on tiny-llama, phases add up to the step."""
from __future__ import annotations

import math

from benchmarks.benchmark_host_overhead import PHASES, main


def test_reports_decode_steps_and_phases(capsys):
    doc = main(["--batch-sizes", "1", "3", "--input-len", "4", "--output-len", "6"])
    assert capsys.readouterr().out.strip().startswith("{")
    assert [r["batch_size"] for r in doc["results"]] == [1, 3]
    for r in doc["results"]:
        # The first output token comes from the prefill; the other 5 are decode steps.
        assert r["decode_steps"] == 5
        assert r["num_outputs"] == r["batch_size"]  # finished outputs only
        phases = r["phases_ms_mean"]
        assert set(phases) == set(PHASES) and all(v >= 0 for v in phases.values())
        assert phases["forward"] > 0 and phases["schedule"] > 0 and phases["sample"] > 0
        assert math.isclose(sum(phases.values()), r["step_ms_mean"], rel_tol=1e-6)


def test_async_scheduling_runs_the_overlapped_path(capsys):
    doc = main(["--batch-sizes", "3", "--input-len", "4", "--output-len", "6", "--async-scheduling"])
    (r,) = doc["results"]
    # One step call more than without it: the last one only applies the step launched before.
    assert r["decode_steps"] == 6
    assert r["num_outputs"] == 3
    assert math.isclose(sum(r["phases_ms_mean"].values()), r["step_ms_mean"], rel_tol=1e-6)


def test_core_outputs_report_every_advanced_request(capsys):
    doc = main(["--batch-sizes", "3", "--input-len", "4", "--output-len", "6", "--core-outputs"])
    (r,) = doc["results"]
    assert doc["core_outputs"] and not doc["finished_only"]
    # Every step reports each of the 3 requests (its delta), not only the finished ones.
    assert r["num_outputs"] == 3 * 6
    assert math.isclose(sum(r["phases_ms_mean"].values()), r["step_ms_mean"], rel_tol=1e-6)
