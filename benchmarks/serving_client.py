"""Streaming OpenAI completions client and the serving metrics computed from it.

One request = one streamed ``/v1/completions`` call; each server-sent chunk that delivers
tokens is an arrival (see ``_tokens_in_chunk``: the chunk's ``token_ids``, which the benchmark
asks for with vLLM's ``return_token_ids``, else one token per chunk with text). TTFT is the
time to the first one, ITL the gaps between them, TPOT (e2e - TTFT) / (output tokens - 1), as
in vLLM's serving benchmark.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import httpx
import numpy as np

from benchmarks.utils import summarize


@dataclass
class RequestResult:
    """What one streamed request measured (times in seconds)."""

    prompt_len: int
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0


def _tokens_in_chunk(choice: dict[str, Any]) -> int:
    """Tokens a chunk delivers: its token ids when the server reports them, else one.

    A chunk without text that ends the choice (finish_reason set) is a closing chunk, no
    token; one without text mid-stream is a token of a server running without a tokenizer.
    """
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    return 1 if choice.get("text") or choice.get("finish_reason") is None else 0


async def send_completion(client: httpx.AsyncClient, url: str,
                          payload: dict[str, Any]) -> RequestResult:
    """Send one streaming completion and time every chunk as it arrives."""
    result = RequestResult(prompt_len=len(payload["prompt"]))
    start = last = time.perf_counter()
    counted = 0
    usage_tokens = None
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:500]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if "error" in chunk:  # the server failed mid-stream
                    result.error = f"stream error: {chunk['error']}"
                    return result
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                choices = chunk.get("choices") or []
                tokens = _tokens_in_chunk(choices[0]) if choices else 0
                if tokens == 0:
                    continue
                if counted == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                counted += tokens
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = time.perf_counter() - start
    result.output_tokens = usage_tokens if usage_tokens is not None else counted
    result.success = counted > 0
    if not result.success:
        result.error = "stream ended without any completion chunk"
    return result


async def request_arrivals(num_requests: int, request_rate: float, burstiness: float,
                           seed: int, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                           ) -> AsyncIterator[int]:
    """Yield request indices at Poisson (burstiness 1) or gamma-distributed intervals.

    ``request_rate`` inf sends everything at once; ``sleep`` is replaceable for tests.
    """
    rng = np.random.default_rng(seed)
    for i in range(num_requests):
        yield i
        if math.isinf(request_rate) or i == num_requests - 1:
            continue
        # Gamma(shape=burstiness, scale=1/(rate*burstiness)) has mean 1/rate.
        await sleep(rng.gamma(burstiness, 1.0 / (request_rate * burstiness)))


@dataclass
class Shard:
    """The requests one client process sends: its share of the payloads (their indices in the
    whole run), of the arrival rate and of the concurrency cap."""

    url: str
    indices: list[int]
    payloads: list[dict[str, Any]]
    request_rate: float
    burstiness: float
    seed: int
    max_concurrency: int | None


def split_shards(url: str, payloads: Sequence[dict[str, Any]], processes: int,
                 request_rate: float, burstiness: float, seed: int,
                 max_concurrency: int | None) -> list[Shard]:
    """Deal the payloads round-robin to `processes` shards. Each shard gets 1/processes of the
    arrival rate (N Poisson streams of rate r/N merge into one of rate r) and of the
    concurrency cap, and its own arrival seed."""
    if processes < 1 or processes > len(payloads):
        raise ValueError(f"--client-processes must be in [1, {len(payloads)}] (one request "
                         f"each at least), got {processes}")
    if max_concurrency is not None and processes > max_concurrency:
        raise ValueError(f"--client-processes ({processes}) must not exceed --max-concurrency "
                         f"({max_concurrency}): each process keeps one request in flight at least")
    shards = []
    for w in range(processes):
        cap = None
        if max_concurrency is not None:
            cap = max_concurrency // processes + (1 if w < max_concurrency % processes else 0)
        indices = list(range(w, len(payloads), processes))
        shards.append(Shard(url, indices, [payloads[i] for i in indices],
                            request_rate / processes, burstiness, seed + w, cap))
    return shards


async def run_shard(shard: Shard) -> tuple[list[RequestResult], float, float]:
    """Send a shard's requests at its arrival times, at most its concurrency cap in flight.
    Returns the results (in the shard's order) and perf_counter() at its start and end."""
    sem = asyncio.Semaphore(shard.max_concurrency) if shard.max_concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:

        async def one(payload: dict[str, Any]) -> RequestResult:
            if sem is None:
                return await send_completion(client, shard.url, payload)
            async with sem:
                return await send_completion(client, shard.url, payload)

        tasks = []
        start = time.perf_counter()
        async for i in request_arrivals(len(shard.payloads), shard.request_rate,
                                        shard.burstiness, shard.seed):
            tasks.append(asyncio.create_task(one(shard.payloads[i])))
        results = await asyncio.gather(*tasks)
        return list(results), start, time.perf_counter()


def _shard_process(shard: Shard, start_barrier: Any, results: Any) -> None:
    start_barrier.wait()
    try:
        results.put((shard.indices, *asyncio.run(run_shard(shard))))
    except BaseException as exc:  # the parent reports it
        results.put((shard.indices, f"{type(exc).__name__}: {exc}", 0.0, 0.0))


def run_in_processes(shards: Sequence[Shard]) -> tuple[list[RequestResult], float]:
    """Run each shard in a process of its own (spawned; all start together), so that parsing
    the streams of many concurrent requests is not one Python thread's work. Returns every
    result in payload order and the wall time from the first start to the last end (one
    system-wide monotonic clock)."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(shards) + 1), ctx.Queue()
    procs = [ctx.Process(target=_shard_process, args=(s, barrier, results), daemon=True)
             for s in shards]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=120)
        merged: dict[int, RequestResult] = {}
        starts, ends = [], []
        for _ in shards:
            while True:
                try:
                    indices, got, start, end = results.get(timeout=1.0)
                    break
                except queue_mod.Empty:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        raise RuntimeError("a client process died") from None
            if isinstance(got, str):
                raise RuntimeError(f"a client process failed: {got}")
            merged.update(zip(indices, got))
            starts.append(start)
            ends.append(end)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [merged[i] for i in sorted(merged)], max(ends) - min(starts)


def serving_metrics(results: Sequence[RequestResult], duration: float,
                    percentiles: Sequence[float]) -> dict[str, Any]:
    """vLLM's serving fields: throughputs plus mean/median/std/pN of ttft, tpot, itl, e2el (ms)."""
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    series = {
        "ttft_ms": [r.ttft for r in ok],
        "tpot_ms": [(r.latency - r.ttft) / (r.output_tokens - 1)
                    for r in ok if r.output_tokens > 1],
        "itl_ms": [gap for r in ok for gap in r.itl],
        "e2el_ms": [r.latency for r in ok],
    }
    for name, values in series.items():
        if values:
            out.update(summarize(values, percentiles, scale=1e3, name=name))
        else:  # e.g. ITL when every request produced one token
            out.update({k: None for k in summarize([0.0], percentiles, name=name)})
    return out
