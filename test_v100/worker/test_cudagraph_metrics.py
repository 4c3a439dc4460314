"""The --cudagraph-metrics table: counts per (tokens, padded tokens, mode), logged per interval."""
from __future__ import annotations

import logging

import pytest

from vllm_volta.worker import cudagraph_metrics
from vllm_volta.worker.cudagraph_metrics import CudagraphMetrics


@pytest.fixture
def logged():
    """Messages the module logs while the test runs."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    cudagraph_metrics.logger.addHandler(handler)
    yield messages
    cudagraph_metrics.logger.removeHandler(handler)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_table_counts_steps_per_mode_and_row(logged):
    clock = Clock()
    metrics = CudagraphMetrics("FULL_AND_PIECEWISE", interval=5.0, max_rows=3, clock=clock)
    steps = [(5, 8, "FULL")] * 4 + [(300, 320, "PIECEWISE")] * 2 + [(9000, 9000, "NONE"),
                                                                   (3, 4, "FULL"), (7, 8, "FULL")]
    for step in steps:
        metrics.observe(*step)
    assert logged == []  # the interval has not passed
    table = metrics.table()
    clock.now += 5.0
    metrics.observe(5, 8, "FULL")
    lines = table.splitlines()
    assert lines[0] == "CUDA graph metrics (mode FULL_AND_PIECEWISE): steps FULL 6, PIECEWISE 2, NONE 1"
    assert lines[1] == "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |"
    # Most frequent first; ties by tokens.
    assert lines[2:5] == ["| 5 | 8 | 3 | FULL | 4 |", "| 300 | 320 | 20 | PIECEWISE | 2 |",
                          "| 3 | 4 | 1 | FULL | 1 |"]
    assert lines[5] == "(2 more rows, 2 steps)"
    assert len(logged) == 1
    assert "FULL 7, PIECEWISE 2, NONE 1" in logged[0] and "| 5 | 8 | 3 | FULL | 5 |" in logged[0]
    assert metrics.table().splitlines()[0].endswith("steps FULL 0, PIECEWISE 0, NONE 0")  # reset


def test_nothing_is_logged_without_steps(logged):
    clock = Clock()
    metrics = CudagraphMetrics("FULL_DECODE_ONLY", clock=clock)
    clock.now += 60
    metrics.log()
    assert logged == []


def test_engine_observes_every_step(tmp_path):
    """On CPU every step is eager (NONE), unpadded; the rows add up to the engine's steps."""
    from test_v100.worker.tiny_models import random_prompts, save_tiny_model
    from vllm_volta import LLM
    from vllm_volta.sampling_params import SamplingParams
    save_tiny_model(tmp_path, "llama")
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu", max_num_batched_tokens=64,
              cudagraph_metrics=True)
    runner = llm.llm_engine.executor.worker.model_runner
    runner.graph_metrics.interval = float("inf")  # keep every count (a log would reset them)
    prompts = random_prompts(3, 20, 40, seed=1)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    counts = runner.graph_metrics._counts
    assert {mode for _, _, mode in counts} == {"NONE"}
    assert all(tokens == padded for tokens, padded, _ in counts)
    assert sum(t * c for (t, _, _), c in counts.items()) == sum(map(len, prompts)) + 3 * 4
    plain = LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu")
    assert plain.llm_engine.executor.worker.model_runner.graph_metrics is None
