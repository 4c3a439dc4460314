"""The OpenAI-compatible HTTP server (FastAPI + uvicorn).

``python -m vllm_volta.entrypoints.openai.api_server --model MODEL`` or
``vllm-volta serve [MODEL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from vllm_volta.engine.async_llm import AsyncLLM
from vllm_volta.entrypoints.openai.cli_args import (
    add_server_args, build_engine_args, check_vllm_flags, load_chat_template, tool_call_parser)
from vllm_volta.entrypoints.openai.errors import install_error_handlers
from vllm_volta.entrypoints.openai.lifecycle import GracefulServer, watch_engine
from vllm_volta.entrypoints.openai.metrics import ServerMetrics
from vllm_volta.entrypoints.openai.middleware import APIKeyMiddleware, BodyLimitMiddleware
from vllm_volta.entrypoints.openai.protocol import (
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, ResponsesRequest,
    TokenizeRequest)
from vllm_volta.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm_volta.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from vllm_volta.entrypoints.openai.serving_responses import OpenAIServingResponses
from vllm_volta.entrypoints.openai.serving_engine import now_s
from vllm_volta.entrypoints.openai.request_body import off_loop, read_request
from vllm_volta.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm_volta.logger import init_logger
from vllm_volta.sampling_params import MAX_LOGPROBS

logger = init_logger(__name__)


def package_version() -> str:
    import vllm_volta

    return vllm_volta.__version__


def _model_limits(engine: AsyncLLM) -> dict[str, int]:
    cfg = engine.model_config
    vocab = cfg.get_vocab_size()
    return {"max_model_len": int(cfg.max_model_len), "vocab_size": int(vocab),
            "max_logprobs": int(getattr(cfg, "max_logprobs", MAX_LOGPROBS))}


def served_names(args: argparse.Namespace, engine: AsyncLLM) -> list[str]:
    cfg = engine.model_config
    return [str(getattr(args, "served_model_name", None)
                or getattr(cfg, "served_model_name", None) or cfg.model)]


def build_app(engine: AsyncLLM, args: argparse.Namespace) -> FastAPI:
    """The FastAPI app serving ``engine`` under the names and options in ``args``."""
    names = served_names(args, engine)
    limits = _model_limits(engine)
    chat_template = load_chat_template(args.chat_template)
    completions = OpenAIServingCompletion(engine, names, **limits)
    embeddings = OpenAIServingEmbedding(engine, names, **limits)
    tokenization = OpenAIServingTokenization(engine, names, chat_template=chat_template,
                                             tool_call_parser=tool_call_parser(args),
                                             reasoning_parser=getattr(args, "reasoning_parser", None),
                                             **limits)
    chat = tokenization  # the tokenization handler is a chat handler too
    responses = OpenAIServingResponses(chat)
    metrics = ServerMetrics(names[0])
    engine.stat_loggers.append(metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.create_task(watch_engine(engine, app))
        yield
        watcher.cancel()
        engine.shutdown()

    app = FastAPI(title="vllm-volta OpenAI-compatible server", version=package_version(),
                  lifespan=lifespan)
    install_error_handlers(app)

    # Added last = outermost: an unauthenticated client is refused before its body is read.
    app.add_middleware(BodyLimitMiddleware,
                       max_bytes=int(getattr(args, "max_request_body_mb", 32) * 2**20))
    if args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=args.api_key,
                           metrics_open=getattr(args, "metrics_without_auth", False))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": package_version()}

    @app.get("/metrics")
    async def get_metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(engine.get_stats()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        root = str(engine.model_config.model)
        data = [{"id": name, "object": "model", "created": now_s(), "owned_by": "vllm-volta",
                 "root": root, "parent": None, "max_model_len": limits["max_model_len"]}
                for name in names]
        return {"object": "list", "data": data}

    # Bodies are read as raw bytes and parsed off the event loop (request_body.py).
    @app.post("/v1/completions")
    async def create_completion(raw_request: Request) -> Any:
        request = await read_request(raw_request, CompletionRequest)
        return await completions.create_completion(request, raw_request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw_request: Request) -> Any:
        request = await read_request(raw_request, ChatCompletionRequest)
        return await chat.create_chat_completion(request, raw_request)

    @app.post("/v1/responses")
    async def create_response(raw_request: Request) -> Any:
        request = await read_request(raw_request, ResponsesRequest)
        return await responses.create_response(request, raw_request)

    @app.post("/v1/embeddings")
    async def create_embedding(raw_request: Request) -> Any:
        request = await read_request(raw_request, EmbeddingRequest)
        return await embeddings.create_embedding(request, raw_request)

    @app.post("/tokenize")
    async def tokenize(raw_request: Request) -> Response:
        request = await read_request(raw_request, TokenizeRequest)
        return _json(await off_loop(lambda: _dumps(tokenization.tokenize_request(request))))

    @app.post("/detokenize")
    async def detokenize(raw_request: Request) -> Response:
        request = await read_request(raw_request, DetokenizeRequest)
        return _json(await off_loop(lambda: _dumps(tokenization.detokenize_request(request))))

    return app


_CHUNK = 1 << 15


def _dumps(payload: dict[str, Any]) -> bytes:
    """The JSON of a /tokenize or /detokenize answer, made in the worker thread. Long lists
    (a million token ids) are serialized in pieces: one json.dumps call holds the interpreter
    lock throughout (a few hundred ms), pieces let the event loop run in between."""
    parts = []
    for key, value in payload.items():
        if isinstance(value, list) and len(value) > _CHUNK:
            pieces = [json.dumps(value[i:i + _CHUNK], ensure_ascii=False, separators=(",", ":"))[1:-1]
                      for i in range(0, len(value), _CHUNK)]
            text = "[" + ",".join(pieces) + "]"
        else:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(json.dumps(key) + ":" + text)
    return ("{" + ",".join(parts) + "}").encode("utf-8")


def _json(body: bytes) -> Response:
    return Response(content=body, media_type="application/json")


def http_stack() -> tuple[str, str]:
    """uvicorn's (event loop, HTTP parser): uvloop and httptools where installed (the
    package's dependencies), else asyncio and h11. Streaming sends one chunk per token and
    request; on a CPU, uvloop + httptools took the event loop's time per streamed token from
    41.4 to 34.6 us (docs/PERFORMANCE_HISTORY.md)."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") is not None else "h11"
    return loop, http


def engine_process_choice(flag: bool | None, device: str) -> tuple[bool, str]:
    """Whether the engine core runs in a process of its own, and why: --[no-]engine-process,
    else on with a GPU, where the server is host-bound at many streams (256 streams on an
    H200: 12.1k in the server's process, 20.6k tok/s in its own; docs/PERFORMANCE_HISTORY.md)."""
    if flag is not None:
        return flag, "--engine-process" if flag else "--no-engine-process"
    if device == "cuda":
        return True, "default with a GPU: the engine's host work and the HTTP event loop " \
                     "then do not share one interpreter lock"
    return False, "default on CPU, where the forward pass, not the host, is the limit"


def run_server(args: argparse.Namespace) -> None:
    """Load the model, start the engine loop and serve until interrupted."""
    import uvicorn

    from vllm_volta.config import DeviceConfig

    load_chat_template(args.chat_template)  # fail fast, before loading the model
    tool_call_parser(args)
    check_vllm_flags(args)
    engine_args = build_engine_args(args)
    own_process, why = engine_process_choice(args.engine_process,
                                             DeviceConfig(engine_args.device).device)
    logger.info("Engine core %s (%s)", "in a process of its own" if own_process
                else "in the server process", why)
    restart = getattr(args, "restart_engine_on_failure", False)
    engine = AsyncLLM.from_engine_args(engine_args, engine_process=own_process,
                                       restart_on_failure=restart)
    app = build_app(engine, args)
    host = args.host or "0.0.0.0"
    loop, http = http_stack()
    logger.info("Serving %s on http://%s:%d (OpenAI API under /v1; uvicorn with the %s event "
                "loop and the %s HTTP parser); on engine failure the server %s",
                served_names(args, engine)[0], host, args.port, loop, http,
                "starts a new engine" if restart else "exits with status 1")
    timeout = float(getattr(args, "shutdown_timeout", 5.0))
    config = uvicorn.Config(app, host=host, port=args.port, log_level=args.uvicorn_log_level,
                            access_log=not args.disable_uvicorn_access_log, timeout_keep_alive=5,
                            # the margin lets streams ended at the timeout send their last events
                            timeout_graceful_shutdown=timeout + 2.0, loop=loop, http=http)
    server = GracefulServer(config, engine, timeout)
    app.state.server = server
    # uvicorn raises the signal it stopped on again once it is done; SIGTERM's default action
    # would then kill the process with status -15, and a graceful stop must exit with 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        engine.shutdown()
    if getattr(app.state, "exit_code", 0):
        sys.exit(app.state.exit_code)


def make_parser() -> argparse.ArgumentParser:
    return add_server_args(argparse.ArgumentParser(
        prog="python -m vllm_volta.entrypoints.openai.api_server",
        description="vllm-volta OpenAI-compatible server"))


def main(argv: list[str] | None = None) -> None:
    run_server(make_parser().parse_args(argv))


if __name__ == "__main__":
    main()
