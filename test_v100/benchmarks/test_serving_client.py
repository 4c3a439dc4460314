"""benchmarks/serving_client.py + benchmark_serving.py against a stub OpenAI server whose
timing is known: TTFT, ITL, TPOT and E2E must come out as the stub paces them."""
from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from benchmarks import benchmark_serving, serving_client
from benchmarks.server_launcher import free_port

FIRST_DELAY, TOKEN_DELAY = 0.06, 0.02


def _stub_app(received: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        received.append(body)
        if body["model"] not in ("stub-model", "stub-coalesced"):
            return JSONResponse({"error": {"message": "unknown model"}}, status_code=404)
        n = body["max_tokens"]

        async def coalesced_events():
            # Two tokens a chunk with their ids, the last ones in the closing chunk without
            # text (a server without a tokenizer that fell behind sends such chunks).
            await asyncio.sleep(FIRST_DELAY)
            for start in range(0, n, 2):
                ids = list(range(start, min(start + 2, n)))
                last = start + 2 >= n
                chunk = {"choices": [{"index": 0, "text": "" if last else " t",
                                      "token_ids": ids,
                                      "finish_reason": "length" if last else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(TOKEN_DELAY)
            yield "data: [DONE]\n\n"

        if body["model"] == "stub-coalesced":
            return StreamingResponse(coalesced_events(), media_type="text/event-stream")

        async def events():
            await asyncio.sleep(FIRST_DELAY)
            for i in range(n):
                if i:
                    await asyncio.sleep(TOKEN_DELAY)
                chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                if body.get("return_token_ids"):
                    chunk["choices"][0]["token_ids"] = [i]
                yield f"data: {json.dumps(chunk)}\n\n"
            # A closing chunk without text and a usage chunk: neither is a token arrival.
            yield f"data: {json.dumps({'choices': [{'index': 0, 'text': '', 'finish_reason': 'length'}]})}\n\n"
            if body.get("stream_options", {}).get("include_usage"):
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def stub():
    received: list[dict] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_stub_app(received), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", received
    server.should_exit = True
    thread.join(timeout=10)


def _run(base_url: str, *argv: str) -> dict:
    return benchmark_serving.main(["--base-url", base_url, "--vocab-size", "100",
                                   "--input-len", "9", *argv])


def test_metrics_follow_the_stub_timing(stub, capsys):
    base_url, received = stub
    received.clear()
    result = _run(base_url, "--num-prompts", "6", "--output-len", "5", "--ignore-eos")
    assert json.loads(capsys.readouterr().out) == result
    assert result["served_model_name"] == "stub-model"
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["total_input_tokens"] == 6 * 9
    assert result["total_output_tokens"] == 6 * 5
    assert result["request_rate"] == "inf"
    assert result["request_throughput"] == pytest.approx(6 / result["duration"])
    assert result["output_throughput"] == pytest.approx(30 / result["duration"])
    ms = 1e3
    assert FIRST_DELAY * ms <= result["median_ttft_ms"] < FIRST_DELAY * ms + 500
    assert TOKEN_DELAY * ms * 0.5 <= result["median_itl_ms"] < TOKEN_DELAY * ms + 200
    assert TOKEN_DELAY * ms * 0.75 <= result["mean_tpot_ms"] < TOKEN_DELAY * ms + 200
    min_e2e = (FIRST_DELAY + 4 * TOKEN_DELAY) * ms
    assert min_e2e <= result["median_e2el_ms"] and result["p99_e2el_ms"] >= result["p50_e2el_ms"]
    # Requests: one probe plus six, token-id prompts in range, vLLM's extension fields.
    assert len(received) == 7
    body = received[-1]
    assert len(body["prompt"]) == 9 and all(0 <= t < 100 for t in body["prompt"])
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 5
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True


@pytest.mark.parametrize("usage", [True, False])
def test_send_completion_counts_token_chunks_only(stub, usage):
    base_url, _ = stub
    payload = {"model": "stub-model", "prompt": [1, 2, 3], "max_tokens": 4, "stream": True}
    if usage:
        payload["stream_options"] = {"include_usage": True}

    async def send() -> serving_client.RequestResult:
        async with serving_client.httpx.AsyncClient() as client:
            return await serving_client.send_completion(client, f"{base_url}/v1/completions",
                                                        payload)

    res = asyncio.run(send())
    assert res.success and res.error == ""
    assert res.output_tokens == 4 and len(res.itl) == 3  # the closing chunk is no token
    assert res.ttft >= FIRST_DELAY
    # Single gaps jitter with the network and the event loop; their sum does not, much.
    assert sum(res.itl) >= 3 * TOKEN_DELAY * 0.75
    assert res.latency >= res.ttft + sum(res.itl) - 1e-6


def test_token_ids_count_every_token_of_a_chunk(stub):
    base_url, _ = stub
    payload = {"model": "stub-coalesced", "prompt": [1, 2, 3], "max_tokens": 5, "stream": True,
               "return_token_ids": True}

    async def send() -> serving_client.RequestResult:
        async with serving_client.httpx.AsyncClient() as client:
            return await serving_client.send_completion(client, f"{base_url}/v1/completions",
                                                        payload)

    res = asyncio.run(send())
    # Chunks of 2, 2 and 1 tokens, the last one without text: 5 tokens, 3 arrivals.
    assert res.success and res.output_tokens == 5 and len(res.itl) == 2


def test_max_concurrency_one_serializes_requests(stub):
    base_url, _ = stub
    result = _run(base_url, "--num-prompts", "3", "--output-len", "2", "--max-concurrency", "1")
    one_request = FIRST_DELAY + TOKEN_DELAY
    assert result["duration"] >= 3 * one_request
    assert result["completed"] == 3 and result["total_output_tokens"] == 6


def test_unknown_model_fails_with_the_server_error(stub):
    base_url, _ = stub
    with pytest.raises(RuntimeError, match="404.*unknown model"):
        _run(base_url, "--num-prompts", "2", "--output-len", "2",
             "--served-model-name", "other")


def test_serving_metrics_one_token_requests_have_no_itl():
    results = [serving_client.RequestResult(prompt_len=3, success=True, ttft=0.1, latency=0.1,
                                            output_tokens=1)]
    out = serving_client.serving_metrics(results, 1.0, [50])
    assert out["mean_itl_ms"] is None and out["mean_tpot_ms"] is None
    assert out["mean_ttft_ms"] == pytest.approx(100)


@pytest.mark.parametrize("burstiness", [1.0, 4.0])
def test_arrivals_have_the_requested_rate(burstiness):
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def collect(rate: float) -> list[int]:
        arrivals = serving_client.request_arrivals(4000, rate, burstiness, 0, sleep=fake_sleep)
        return [i async for i in arrivals]

    assert asyncio.run(collect(20.0)) == list(range(4000))
    assert len(sleeps) == 3999
    assert statistics.fmean(sleeps) == pytest.approx(1 / 20, rel=0.06)
    # Gamma(k) intervals: coefficient of variation 1/sqrt(k) (1 = Poisson).
    cv = np.std(sleeps) / np.mean(sleeps)
    assert cv == pytest.approx(1 / np.sqrt(burstiness), rel=0.1)
    sleeps.clear()
    asyncio.run(collect(float("inf")))
    assert sleeps == []


@pytest.mark.parametrize("argv,field", [(["--request-rate", "0"], "--request-rate"),
                                        (["--max-concurrency", "0"], "--max-concurrency"),
                                        (["--burstiness", "0"], "--burstiness")])
def test_rejects_bad_arguments(argv, field):
    with pytest.raises(ValueError, match=field):
        benchmark_serving.parse_args(["--base-url", "http://x", "--vocab-size", "10", *argv])
    with pytest.raises(ValueError, match="--vocab-size"):
        benchmark_serving.parse_args(["--base-url", "http://x"])


def test_shards_split_requests_rate_and_concurrency():
    payloads = [{"prompt": [i]} for i in range(7)]
    shards = serving_client.split_shards("u", payloads, 3, 30.0, 2.0, 5, 4)
    assert [s.indices for s in shards] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [p["prompt"][0] for s in shards for p in s.payloads] == [0, 3, 6, 1, 4, 2, 5]
    assert [s.request_rate for s in shards] == [10.0] * 3
    assert [s.max_concurrency for s in shards] == [2, 1, 1]
    assert [s.seed for s in shards] == [5, 6, 7] and {s.burstiness for s in shards} == {2.0}
    inf = serving_client.split_shards("u", payloads, 2, float("inf"), 1.0, 0, None)
    assert [s.max_concurrency for s in inf] == [None, None] and inf[0].request_rate == float("inf")
    with pytest.raises(ValueError, match="--client-processes"):
        serving_client.split_shards("u", payloads, 8, 1.0, 1.0, 0, None)
    with pytest.raises(ValueError, match="--max-concurrency"):
        serving_client.split_shards("u", payloads, 3, 1.0, 1.0, 0, 2)


@pytest.mark.parametrize("argv,expected", [
    (["--num-prompts", "300"], 5),  # all at once: one process per 64 in flight
    (["--num-prompts", "1000"], 8),  # at most half of the 16 CPUs
    (["--num-prompts", "30"], 1),
    (["--num-prompts", "300", "--max-concurrency", "256"], 4),
    (["--num-prompts", "300", "--max-concurrency", "65"], 2),
    (["--num-prompts", "300", "--client-processes", "3"], 3)])
def test_client_processes_follow_the_requests_in_flight(monkeypatch, argv, expected):
    monkeypatch.setattr(benchmark_serving.os, "cpu_count", lambda: 16)
    args = benchmark_serving.parse_args(["--base-url", "http://x", "--vocab-size", "10", *argv])
    assert benchmark_serving.client_processes(args) == expected


def test_client_processes_share_the_requests(stub):
    base_url, received = stub
    received.clear()
    result = _run(base_url, "--num-prompts", "6", "--output-len", "3", "--max-concurrency", "2",
                  "--client-processes", "2")
    assert result["client_processes"] == 2
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["total_output_tokens"] == 18 and result["total_input_tokens"] == 6 * 9
    # The probe plus each timed prompt exactly once.
    timed = [tuple(body["prompt"]) for body in received[1:]]
    assert len(timed) == 6 and len(set(timed)) == 6
    # One request in flight per process: three after another in each.
    one_request = FIRST_DELAY + 2 * TOKEN_DELAY
    assert result["duration"] >= 3 * one_request
    assert result["mean_ttft_ms"] >= FIRST_DELAY * 1e3
