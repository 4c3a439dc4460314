"""benchmarks/benchmark_long_prefill_itl.py: the gap bookkeeping, and a CPU run on the tiny config."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks import benchmark_long_prefill_itl as itl


def _out(rid, n):
    return SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=list(range(n)))])


def test_gaps_count_each_new_token_once_by_arrival_window():
    streams = itl._Streams(["a", "b"])
    streams.observe([_out("a", 1), _out("b", 1), _out("other", 5)], 1.0)
    streams.observe([_out("a", 2)], 1.5)  # b got nothing this step
    streams.observe([_out("a", 2), _out("b", 2)], 2.5)  # a's count did not grow: no arrival
    streams.observe([_out("a", 3), _out("b", 3)], 4.0)
    assert streams.arrivals == {"a": [1.0, 1.5, 4.0], "b": [1.0, 2.5, 4.0]}
    assert streams.min_count() == 3
    assert sorted(streams.gaps(0.0, 10.0)) == [0.5, 1.5, 1.5, 2.5]
    assert sorted(streams.gaps(1.5, 4.0)) == [1.5, 1.5, 2.5]  # later token in (1.5, 4.0]: not a at 1.5
    assert itl._stats([]) is None
    assert itl._stats([1.0, 3.0])["p50"] == 2.0


@pytest.mark.parametrize("argv,match", [(["--prefill-len", "0"], "--prefill-len"),
                                        (["--num-streams", "0"], "--num-streams"),
                                        (["--warmup-tokens", "-1"], "--warmup-tokens")])
def test_bad_arguments(argv, match):
    with pytest.raises(ValueError, match=match):
        itl.parse_args(["--config", "tiny-llama", *argv])


def test_runs_on_the_tiny_config(capsys):
    result = itl.main(["--config", "tiny-llama", "--max-model-len", "256", "--prefill-len", "96",
                       "--max-num-batched-tokens", "32", "--num-streams", "2", "--stream-input-len", "8",
                       "--baseline-tokens", "3", "--warmup-tokens", "1"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["benchmark"] == "long_prefill_itl" and result["max_num_batched_tokens"] == 32
    before, during = result["itl_before"], result["itl_during_prefill"]
    assert before["count"] >= 2 * 3 and during["count"] >= 2
    assert 0 < before["p50"] <= before["p99"] and 0 < during["p50"] <= during["p99"]
    assert result["p99_ratio"] == pytest.approx(during["p99"] / before["p99"])
    assert result["target_met"] == (result["p99_ratio"] <= 2.0)
    # 96 prompt tokens at most 32 a step beside 2 decodes: at least 4 steps.
    assert result["prefill_steps"] >= 4 and result["prefill_time_to_first_token"] > 0


def test_prompt_longer_than_the_model_is_a_clear_error():
    with pytest.raises(ValueError, match="--max-model-len"):
        itl.main(["--config", "tiny-llama", "--max-model-len", "64", "--prefill-len", "64",
                  "--baseline-tokens", "1", "--stream-input-len", "4"])
