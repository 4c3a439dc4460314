"""profile_steps: decode or prefill steps of a real engine (tiny-llama; on a CPU there are no
CUDA kernels, so there only the step counts and wall times carry information)."""
from __future__ import annotations

import pytest
import torch

from benchmarks.profile_steps import main


def test_decode_phase_profiles_the_requested_number_of_steps(capsys):
    doc = main(["--config", "tiny-llama", "--batch-size", "2", "--input-len", "8",
                "--output-len", "12", "--warmup-steps", "2", "--profile-steps", "4"])
    assert capsys.readouterr().out.strip().startswith("{")
    assert doc["phase"] == "decode" and doc["profiled_steps"] == 4
    assert doc["decode_rows"] == 2
    assert doc["wall_ms_per_step"] > 0
    if torch.cuda.is_available():
        assert doc["gpu_kernel_ms_per_step"] > 0 and doc["top_kernels"]
    else:
        assert doc["gpu_kernel_ms_per_step"] == 0.0


@pytest.mark.parametrize("budget, expected_steps", [(None, 1), ("16", 3)])
def test_prefill_phase_profiles_the_steps_that_run_the_prompts(budget, expected_steps):
    # 3 prompts of 16 tokens: one step, or one step per prompt under a 16-token budget.
    argv = ["--config", "tiny-llama", "--batch-size", "3", "--input-len", "16",
            "--output-len", "2", "--phase", "prefill"]
    if budget is not None:
        argv += ["--max-num-batched-tokens", budget, "--max-model-len", "32"]
    doc = main(argv)
    assert doc["phase"] == "prefill" and doc["profiled_steps"] == expected_steps
    assert doc["wall_ms_per_step"] > 0


def test_decode_phase_needs_enough_output_tokens():
    with pytest.raises(ValueError, match="--output-len"):
        main(["--config", "tiny-llama", "--output-len", "10", "--warmup-steps", "5",
              "--profile-steps", "5"])


def test_prefill_phase_waits_for_the_last_chunk_of_every_prompt():
    # 3 x 24 prompt tokens under a 16-token budget: at least ceil(72 / 16) = 5 steps. Stopping
    # once no request waits (the last prompt's first chunk scheduled) would count fewer.
    doc = main(["--config", "tiny-llama", "--batch-size", "3", "--input-len", "24",
                "--output-len", "2", "--phase", "prefill", "--max-num-batched-tokens", "16",
                "--max-model-len", "32"])
    assert doc["profiled_steps"] >= 5


def test_decode_phase_reports_rows_that_finished_before_the_profile(capsys):
    # 6 prompts of 16 tokens under a 16-token budget: one prompt per step, so the first
    # prompts' 8 tokens run out before the profile starts (step 7 on); those rows are missing.
    doc = main(["--config", "tiny-llama", "--batch-size", "6", "--input-len", "16",
                "--output-len", "8", "--warmup-steps", "1", "--profile-steps", "2",
                "--max-num-batched-tokens", "16", "--max-model-len", "32"])
    assert 0 < doc["decode_rows"] < 6
    assert f"only {doc['decode_rows']} of 6 requests are still decoding" in capsys.readouterr().err


def test_chrome_trace_holds_the_profiled_steps(tmp_path):
    import json

    trace = tmp_path / "steps.json"
    main(["--config", "tiny-llama", "--batch-size", "1", "--input-len", "8", "--output-len", "8",
          "--warmup-steps", "1", "--profile-steps", "3", "--chrome-trace", str(trace)])
    events = json.loads(trace.read_text())["traceEvents"]
    # The model's forward ran inside the profile: its ops are in the trace.
    assert any(ev.get("name", "").startswith("aten::") for ev in events)
