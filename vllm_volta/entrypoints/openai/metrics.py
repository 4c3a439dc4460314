"""GET /metrics: engine and latency metrics in the Prometheus text format.

Names follow vLLM's (``vllm:num_requests_running``, ``vllm:time_to_first_token_seconds``,
...) so existing dashboards work. Written by hand: the text format is small and this
keeps prometheus_client out of the dependencies.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

# Buckets as in vLLM.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    return repr(float(value)) if value != float("inf") else "+Inf"


class Histogram:
    """A cumulative-bucket histogram (observations from any thread)."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.buckets = name, doc, tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)  # last = +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def render(self, labels: dict[str, str]) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, c in zip(self.buckets + (float("inf"),), counts):
            running += c
            lines.append(f"{self.name}_bucket{_labels({**labels, 'le': _num(bound)})} "
                         f"{_num(running)}")
        lines.append(f"{self.name}_count{_labels(labels)} {_num(running)}")
        lines.append(f"{self.name}_sum{_labels(labels)} {_num(total)}")
        return lines


def _sample(name: str, kind: str, doc: str, value: float, labels: dict[str, str]) -> list[str]:
    return [f"# HELP {name} {doc}", f"# TYPE {name} {kind}",
            f"{name}{_labels(labels)} {_num(value)}"]


class ServerMetrics:
    """Collects request timings (a StatLogger for AsyncLLM) and renders /metrics."""

    def __init__(self, model_name: str) -> None:
        self.labels = {"model_name": model_name}
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", E2E_BUCKETS)
        self._finished: dict[str, int] = {}
        self._lock = threading.Lock()

    # StatLogger interface (called from the engine thread)
    def on_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def on_tokens(self, inter_token_s: float) -> None:
        self.itl.observe(inter_token_s)

    def on_finished(self, e2e_s: float, finish_reason: str | None) -> None:
        self.e2e.observe(e2e_s)
        with self._lock:
            key = finish_reason or "unknown"
            self._finished[key] = self._finished.get(key, 0) + 1

    def render(self, stats: Any) -> str:
        """The whole /metrics page for the latest engine stats snapshot."""
        labels = self.labels
        lines: list[str] = []
        if stats is not None:
            gauges = (
                ("vllm:num_requests_running", "Number of requests in model execution batches.",
                 "num_running"),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                 "num_waiting"),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 "kv_cache_usage"),
                ("vllm:num_kv_cache_blocks_free", "Number of free KV-cache blocks.",
                 "num_free_blocks"),
                ("vllm:num_kv_cache_blocks_total", "Number of KV-cache blocks.",
                 "num_total_blocks"),
            )
            for name, doc, attr in gauges:
                lines += _sample(name, "gauge", doc, getattr(stats, attr, 0), labels)
            counters = (
                ("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                 "prompt_tokens_total"),
                ("vllm:generation_tokens_total", "Number of generation tokens processed.",
                 "generation_tokens_total"),
                ("vllm:num_preemptions_total", "Cumulative number of preemptions.",
                 "num_preemptions_total"),
                ("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix "
                 "cache.", "prefix_cache_queries_total"),
                ("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
                 "prefix_cache_hits_total"),
            )
            for name, doc, attr in counters:
                lines += _sample(name, "counter", doc, getattr(stats, attr, 0), labels)
        with self._lock:
            finished = dict(self._finished)
        lines += ["# HELP vllm:request_success_total Count of successfully processed requests.",
                  "# TYPE vllm:request_success_total counter"]
        for reason, count in sorted(finished.items()):
            lines.append(f"vllm:request_success_total"
                         f"{_labels({**labels, 'finished_reason': reason})} {_num(count)}")
        for hist in (self.ttft, self.itl, self.e2e):
            lines += hist.render(labels)
        return "\n".join(lines) + "\n"
