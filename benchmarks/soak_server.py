"""Soak the OpenAI server for a bounded time with mixed traffic, then print JSON.

Traffic (each worker picks at random): streamed and plain completions and chats read to the
end, streams the client drops after a few events, plain requests the client gives up on, bad
input (lone surrogates, invalid JSON and UTF-8, deep JSON, out-of-vocabulary ids, bad fields,
prompts past max_model_len) and /tokenize calls. Reported: requests per kind and status,
``lost`` (a request that should have completed but did not: a transport error, a stream
without ``[DONE]``, a timeout), the 5xx count, the server's RSS (server and engine core
processes) over time, and whether /metrics shows every KV block free once traffic stops.

    python -m benchmarks.soak_server --minutes 3 --concurrency 4
    python -m benchmarks.soak_server --url http://127.0.0.1:8000 --minutes 1
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import time
from typing import Any

import httpx

from benchmarks.server_launcher import launched_server
from benchmarks.utils import log

MSGS = [{"role": "user", "content": "Tell me about the sea."}]


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children (the engine core), in MB (Linux /proc)."""
    total = 0
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode()  # ASCII JSON: lone surrogates travel as \\ud800


def bad_inputs(model: str) -> list[tuple[str, str, bytes]]:
    """(name, path, raw body) of inputs that must get a 4xx, never a 5xx."""
    deep = b"[" * 100000 + b"]" * 100000
    return [
        ("lone surrogate chat", "/v1/chat/completions",
         _raw({"model": model, "messages": [{"role": "user", "content": "hi \ud800 x"}]})),
        ("lone surrogate tokenize", "/tokenize", _raw({"prompt": "\udfff"})),
        ("invalid json", "/v1/completions", b'{"prompt": '),
        ("invalid utf-8", "/v1/completions", b'{"model": "m", "prompt": "\xff\xfe"}'),
        ("deep json", "/v1/completions", b'{"prompt": ' + deep + b"}"),
        ("out-of-vocabulary ids", "/v1/completions", _raw({"model": model, "prompt": [1, 10**9]})),
        ("negative max_tokens", "/v1/completions",
         _raw({"model": model, "prompt": "a", "max_tokens": -1})),
        ("prompt past max_model_len", "/v1/completions",
         _raw({"model": model, "prompt": "hello " * 200000, "max_tokens": 4})),
        ("unsatisfiable regex", "/v1/completions",
         _raw({"model": model, "prompt": "a", "guided_regex": "a^b"})),
    ]


class Soak:
    def __init__(self, base_url: str, model: str, max_tokens: int, seed: int) -> None:
        self.url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self.counts: collections.Counter = collections.Counter()
        self.statuses: collections.Counter = collections.Counter()
        self.lost: list[str] = []
        self.num_5xx = 0
        self.bad = bad_inputs(model)

    def _status(self, kind: str, status: int) -> None:
        self.statuses[f"{kind}:{status}"] += 1
        if status >= 500:
            self.num_5xx += 1

    async def _stream(self, client: httpx.AsyncClient, kind: str, drop_after: int | None) -> None:
        chat = self.rng.random() < 0.5
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "max_tokens": self.rng.randint(1, self.max_tokens)}
        body.update({"messages": MSGS} if chat else {"prompt": "Once upon a time"})
        events, done = 0, False
        async with client.stream("POST", self.url + path, json=body) as resp:
            self._status(kind, resp.status_code)
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    events += 1
                    done = line == "data: [DONE]"
                    if drop_after is not None and events >= drop_after:
                        return  # the client goes away mid-stream
        if resp.status_code == 200 and not done:
            self.lost.append(f"{kind}: stream ended without [DONE] after {events} events")

    async def _plain(self, client: httpx.AsyncClient, kind: str, give_up_s: float | None) -> None:
        body = {"model": self.model, "prompt": "The sea is",
                "max_tokens": self.rng.randint(1, self.max_tokens)}
        if give_up_s is not None:
            try:  # the client disconnects before the answer
                await asyncio.wait_for(client.post(self.url + "/v1/completions", json=body),
                                       give_up_s)
            except asyncio.TimeoutError:
                pass
            return
        resp = await client.post(self.url + "/v1/completions", json=body)
        self._status(kind, resp.status_code)
        if resp.status_code == 200 and not resp.json()["choices"][0]["finish_reason"]:
            self.lost.append(f"{kind}: no finish_reason")

    async def one(self, client: httpx.AsyncClient) -> None:
        roll = self.rng.random()
        kind = ("stream" if roll < 0.35 else "stream_dropped" if roll < 0.5 else
                "plain" if roll < 0.7 else "plain_abandoned" if roll < 0.8 else
                "bad_input" if roll < 0.95 else "tokenize")
        self.counts[kind] += 1
        try:
            if kind == "stream":
                await self._stream(client, kind, None)
            elif kind == "stream_dropped":
                await self._stream(client, kind, self.rng.randint(1, 4))
            elif kind == "plain":
                await self._plain(client, kind, None)
            elif kind == "plain_abandoned":
                await self._plain(client, kind, self.rng.uniform(0.05, 0.5))
            elif kind == "bad_input":
                name, path, raw = self.rng.choice(self.bad)
                resp = await client.post(self.url + path, content=raw,
                                         headers={"content-type": "application/json"})
                self._status(f"bad:{name}", resp.status_code)
                if resp.status_code < 400:
                    self.lost.append(f"bad input {name!r} accepted ({resp.status_code})")
            else:
                text = "the quick brown fox " * self.rng.randint(1, 20000)
                resp = await client.post(self.url + "/tokenize", json={"prompt": text})
                self._status(kind, resp.status_code)
        except httpx.HTTPError as exc:
            self.lost.append(f"{kind}: {type(exc).__name__}: {exc}")

    async def worker(self, deadline: float) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            while time.monotonic() < deadline:
                await self.one(client)


async def metrics_settled(url: str, timeout: float = 30.0) -> dict[str, float]:
    """/metrics gauges once nothing runs (or the last reading after ``timeout``)."""
    values: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            page = (await client.get(url + "/metrics")).text
            values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                      for line in page.splitlines()
                      if line.startswith(("vllm:num_requests", "vllm:num_kv_cache_blocks"))}
            if values.get("vllm:num_requests_running", 1) == 0 and \
                    values.get("vllm:num_requests_waiting", 1) == 0:
                break
            await asyncio.sleep(0.5)
    return values


async def soak(url: str, pid: int | None, model: str, args: argparse.Namespace) -> dict:
    runner = Soak(url, model, args.max_tokens, args.seed)
    start = time.monotonic()
    deadline = start + args.minutes * 60
    rss: list[tuple[float, float]] = []

    async def sample_rss() -> None:
        while time.monotonic() < deadline:
            if pid is not None:
                rss.append((round(time.monotonic() - start, 1), rss_mb(pid)))
            await asyncio.sleep(args.rss_interval)

    await asyncio.gather(sample_rss(), *(runner.worker(deadline) for _ in range(args.concurrency)))
    gauges = await metrics_settled(url)
    if pid is not None:
        rss.append((round(time.monotonic() - start, 1), rss_mb(pid)))
    return {"minutes": args.minutes, "concurrency": args.concurrency,
            "requests": sum(runner.counts.values()), "by_kind": dict(runner.counts),
            "statuses": dict(sorted(runner.statuses.items())), "lost": len(runner.lost),
            "lost_examples": runner.lost[:10], "num_5xx": runner.num_5xx,
            "rss_mb": rss, "metrics_after": gauges,
            "all_blocks_free": gauges.get("vllm:num_kv_cache_blocks_free")
            == gauges.get("vllm:num_kv_cache_blocks_total")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="How long to run (bounded).")
    parser.add_argument("--concurrency", type=int, default=4, help="Concurrent clients.")
    parser.add_argument("--model", default=None, help="Model to serve (default: the default model).")
    parser.add_argument("--url", default=None, help="Soak a running server instead of starting one.")
    parser.add_argument("--server-flags", default="", help="Extra `vllm-volta serve` flags.")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rss-interval", type=float, default=10.0, help="Seconds between RSS samples.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.minutes <= 0 or args.concurrency <= 0:
        parser.error("--minutes and --concurrency must be positive")
    if args.url:
        model = args.model or httpx.get(args.url + "/v1/models").json()["data"][0]["id"]
        result = asyncio.run(soak(args.url.rstrip("/"), None, model, args))
    else:
        from vllm_volta.transformers_utils.default_model import get_default_model_path

        model_path = args.model or str(get_default_model_path())
        flags = ["--disable-uvicorn-access-log", *args.server_flags.split()]
        with launched_server(model_path, flags, args.server_timeout) as (url, pid):
            model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
            log(f"soaking {url} for {args.minutes} min with {args.concurrency} clients")
            result = asyncio.run(soak(url, pid, model, args))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
