"""benchmarks/benchmark_long_prefill_policy.py: one row per policy setting, on the tiny config (CPU)."""
from __future__ import annotations

import json

import pytest

from benchmarks import benchmark_long_prefill_policy as sweep


def test_bad_sweep_values():
    with pytest.raises(ValueError, match="--reference-lens"):
        sweep.parse_args(["--config", "tiny-llama", "--reference-lens", "-1"])
    with pytest.raises(ValueError, match="--prefill-len"):  # the ITL benchmark's own checks apply
        sweep.parse_args(["--config", "tiny-llama", "--prefill-len", "0"])


def test_sweep_on_the_tiny_config(capsys):
    result = sweep.main(["--config", "tiny-llama", "--max-model-len", "256", "--prefill-len", "96",
                         "--max-num-batched-tokens", "32", "--num-streams", "1", "--stream-input-len", "8",
                         "--baseline-tokens", "3", "--warmup-tokens", "1", "--reference-lens", "0", "2",
                         "--thresholds", "0", "16"])
    assert json.loads(capsys.readouterr().out) == result
    rows = {(r["prefill_attention_reference_len"], r["long_prefill_token_threshold"]): r for r in result["rows"]}
    assert set(rows) == {(0, 0), (0, 16), (2, 0), (2, 16)}
    # 96 tokens beside one decode: 31 a step uncapped (4 steps), 16 under the threshold (6 steps),
    # and many more under a 64-pair attention budget (chunks of 11 tokens down to 1).
    assert rows[0, 0]["prefill_steps"] == 4 and rows[0, 16]["prefill_steps"] == 6
    assert rows[2, 0]["prefill_steps"] > 20
    assert all(r["prefill_time_to_first_token"] > 0 and r["itl_p99_during"] > 0 for r in rows.values())
