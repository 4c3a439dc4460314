"""/metrics: valid Prometheus text (checked with prometheus_client's parser) whose numbers
follow the requests the server actually ran."""

from __future__ import annotations

import httpx
import pytest

from test_v100.entrypoints.openai.conftest import MODEL_NAME
from test_v100.entrypoints.openai.utils import metric, parse_metrics
from vllm_volta.engine.llm_engine import EngineStats
from vllm_volta.entrypoints.openai.metrics import TTFT_BUCKETS, Histogram, ServerMetrics

parser = pytest.importorskip("prometheus_client.parser")


def _stats(**overrides) -> EngineStats:
    fields = dict(num_running=3, num_waiting=2, kv_cache_usage=0.25, num_free_blocks=30,
                  num_total_blocks=40, prompt_tokens_total=100, generation_tokens_total=50)
    return EngineStats(**{**fields, **overrides})


def test_render_parses_as_prometheus():
    m = ServerMetrics('odd "name"\\x')
    for v in (0.003, 0.003, 0.5, 99999.0):
        m.on_first_token(v)
    m.on_tokens(0.02)
    m.on_finished(1.2, "length")
    m.on_finished(0.4, "stop")
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render(_stats()))}
    assert families["vllm:num_requests_running"].type == "gauge"
    assert families["vllm:num_requests_running"].samples[0].value == 3
    assert families["vllm:num_requests_running"].samples[0].labels == {
        "model_name": 'odd "name"\\x'}
    assert families["vllm:kv_cache_usage_perc"].samples[0].value == 0.25
    assert families["vllm:prompt_tokens"].type == "counter"
    assert families["vllm:prompt_tokens"].samples[0].value == 100
    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in ttft.samples if s.name.endswith("_bucket")}
    assert buckets["0.001"] == 0 and buckets["0.005"] == 2 and buckets["0.5"] == 3
    assert buckets["+Inf"] == 4 and len(buckets) == len(TTFT_BUCKETS) + 1
    count = next(s.value for s in ttft.samples if s.name.endswith("_count"))
    total = next(s.value for s in ttft.samples if s.name.endswith("_sum"))
    assert count == 4 and total == pytest.approx(0.003 * 2 + 0.5 + 99999.0)
    reasons = {s.labels["finished_reason"]: s.value
               for s in families["vllm:request_success"].samples}
    assert reasons == {"length": 1, "stop": 1}


def test_histogram_bucket_edges_are_inclusive():
    h = Histogram("h", "doc", (1.0, 2.0))
    for v in (1.0, 1.5, 2.0, 3.0):
        h.observe(v)
    page = "\n".join(h.render({})) + "\n"
    (family,) = parser.text_string_to_metric_families(page)
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name == "h_bucket"}
    assert buckets == {"1.0": 1, "2.0": 3, "+Inf": 4}


def test_live_counters_follow_a_request(server, client):
    before = httpx.get(server.url + "/metrics", timeout=10).text
    resp = client.completions.create(model=MODEL_NAME, prompt="Hello metrics", max_tokens=6,
                                     temperature=0, extra_body={"ignore_eos": True})
    after = httpx.get(server.url + "/metrics", timeout=10).text
    list(parser.text_string_to_metric_families(after))  # the live page parses too

    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    assert delta("vllm:prompt_tokens_total") == resp.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total") == resp.usage.completion_tokens == 6
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    # One inter-token gap per token after the first (one token per step for n=1).
    assert delta("vllm:inter_token_latency_seconds_count") == 5
    key = f'vllm:request_success_total{{model_name="{MODEL_NAME}",finished_reason="length"}}'
    assert parse_metrics(after)[key] - parse_metrics(before).get(key, 0) == 1
    assert metric(after, "vllm:num_requests_running") == 0
