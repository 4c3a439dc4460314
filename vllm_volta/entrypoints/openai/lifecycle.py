"""How the server ends: when its engine dies for good, and when it is asked to stop.

Engine death (the core process killed, a CUDA error, a lost tensor-parallel worker) fails the
requests in flight (AsyncLLM); ``watch_engine`` then stops the server so the process exits with
status 1 and a supervisor starts a fresh one, as vLLM does. With --restart-engine-on-failure
AsyncLLM starts a new engine instead and the server stays up.

SIGTERM (or SIGINT): ``GracefulServer`` stops accepting connections, lets requests in flight
run for --shutdown-timeout seconds, then ends what is left (each stream gets an error event
and ``[DONE]``, a plain request a 503) and exits with status 0.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from vllm_volta.engine.async_llm import AsyncLLM
from vllm_volta.engine.engine_errors import ServerShuttingDown
from vllm_volta.logger import init_logger

logger = init_logger(__name__)

_WATCH_INTERVAL_S = 0.1
_FLUSH_S = 0.5  # time for the error events of the failed requests to reach their clients


async def watch_engine(engine: AsyncLLM, app: Any) -> None:
    """Stop the server (exit status 1) once the engine has failed for good."""
    while not engine.failed:
        await asyncio.sleep(_WATCH_INTERVAL_S)
    logger.error("The engine is dead (%s); stopping the server with exit status 1 so that a "
                 "supervisor can start it again (--restart-engine-on-failure restarts the engine "
                 "in place)", engine.dead)
    await asyncio.sleep(_FLUSH_S)
    app.state.exit_code = 1
    server = getattr(app.state, "server", None)
    if server is not None:
        server.should_exit = True


class GracefulServer(uvicorn.Server):
    """uvicorn's server, ending the requests still running ``shutdown_timeout`` seconds after
    it starts to shut down (uvicorn would cancel their tasks, cutting streams mid-way)."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout

    async def shutdown(self, sockets: list | None = None) -> None:
        running = self.engine.num_requests
        if running:
            logger.info("Shutting down: no new connections; %d requests in flight get up to "
                        "%g s to finish (--shutdown-timeout)", running, self.shutdown_timeout)
        timer = asyncio.get_running_loop().call_later(
            self.shutdown_timeout, self.engine.fail_requests,
            ServerShuttingDown(f"the server is shutting down and the request did not finish "
                               f"within {self.shutdown_timeout:g} s"))
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
