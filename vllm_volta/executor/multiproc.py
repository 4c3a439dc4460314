"""MultiprocExecutor: tensor and pipeline parallelism with one worker process per device.

Rank 0 (the driver) runs in this process; ranks 1..N-1 are spawned processes that receive
each call over a pipe. Rank r is TP rank r % tp of pipeline stage r // tp: a stage holds a
slice of the layers (model_executor/layers/pipeline_stage.py), every rank of a stage 1/tp of
each of them (tensor-parallel sharding), and the ranks meet in torch.distributed collectives
inside the forward pass (NCCL on GPUs, gloo on CPUs); stages hand their activations on by
point-to-point sends. TP rank 0 of the last stage samples (the driver, without pipeline
parallelism): it keeps copies of the requests, updated by deltas (ray_request_sync.py), and its
answer is the step's. The other ranks receive a slim copy of each step's schedule (the tokens
to run, positions, block tables). Steps are answered in launch order, so several can be in
flight (the pipeline's micro-batches).
"""
from __future__ import annotations

import multiprocessing
import pickle
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vllm_volta.config import VllmConfig
from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.engine.gc_policy import freeze_startup_heap, raise_gc_threshold
from vllm_volta.executor.abstract import Executor
from vllm_volta.executor.ray_request_sync import DriverScheduleEncoder, RankZeroRequests
from vllm_volta.logger import init_logger
from vllm_volta.worker.model_runner import ModelRunnerOutput, PendingOutput
from vllm_volta.worker.worker import Worker

logger = init_logger(__name__)

_READY_TIMEOUT_S = 600.0  # model loading on every rank


@dataclass
class _PromptLogprobsOnly:
    prompt_logprobs: int | None


@dataclass
class _RemoteRequest:
    """What a non-driver rank reads of a request (it runs the model, never samples)."""

    request_id: str
    num_prompt_tokens: int
    sampling_params: _PromptLogprobsOnly


def slim_scheduler_output(out: SchedulerOutput) -> SchedulerOutput:
    """The step as a worker rank needs it: no token histories, params or block hashes."""
    scheduled = [replace(s, request=_RemoteRequest(
        s.request.request_id, s.request.num_prompt_tokens,
        _PromptLogprobsOnly(s.request.sampling_params.prompt_logprobs)))
        for s in out.scheduled]
    return SchedulerOutput(scheduled=scheduled,
                           total_num_scheduled_tokens=out.total_num_scheduled_tokens,
                           finished_req_ids=set(out.finished_req_ids))


def _worker_main(vllm_config: VllmConfig, rank: int, world_size: int, init_method: str,
                 conn: Any) -> None:
    """Entry point of a spawned rank: build the worker, then serve calls until shutdown."""
    requests = RankZeroRequests()  # the sampling rank's copies of the requests
    try:
        worker = Worker(vllm_config, rank, world_size, init_method)
        worker.load_model()
    except BaseException as e:  # report, so the driver fails with the reason, not a hang
        conn.send(("error", f"rank {rank} failed to start: {type(e).__name__}: {e}"))
        raise
    conn.send(("ok", None))
    while True:
        method, args = pickle.loads(conn.recv_bytes())
        if method == "shutdown":
            worker.shutdown()
            conn.send(("ok", None))
            return
        try:
            if method == "execute_driver_step":  # the sampling rank: requests as deltas
                result = worker.execute_model(requests.decode(args[0]))
            else:
                result = getattr(worker, method)(*args)
        except BaseException as e:
            conn.send(("error", f"rank {rank}: {method} failed: {type(e).__name__}: {e}"))
            continue
        if method == "initialize_cache":
            # The rank is built (model, KV cache, graphs): the driver's engine process does the
            # same (engine/gc_policy.py), so a full collection in a rank does not stall the
            # collectives of a step. The process ends with the engine: the freeze is never undone.
            raise_gc_threshold()
            freeze_startup_heap()
        conn.send(("ok", result))


class _RanksPending:
    """A step launched on every rank: the driver's PendingOutput, whose result() also reads
    the other ranks' answers to the step (in launch order: steps are finished in order).
    ``sampler``: the spawned rank whose answer is the step's output (pipeline parallelism),
    None for the driver."""

    def __init__(self, driver: PendingOutput, collect: Callable[[], list[Any]],
                 sampler: int | None = None) -> None:
        self._driver = driver
        self._collect: Callable[[], list[Any]] | None = collect
        self._sampler = sampler
        self._output: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        if self._collect is not None:
            collect, self._collect = self._collect, None
            answers = collect()
            if self._sampler is not None:
                self._output = answers[self._sampler - 1]
        driver = self._driver.result()
        return driver if self._sampler is None else self._output


def _terminate(processes: list, tmpdir: str) -> None:
    for proc in processes:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
    shutil.rmtree(tmpdir, ignore_errors=True)


class MultiprocExecutor(Executor):
    def _init_executor(self) -> None:
        pc = self.vllm_config.parallel_config
        world_size = pc.world_size
        # The rank that samples: TP rank 0 of the last stage (Worker.sampler_rank).
        self._sampler = (pc.pipeline_parallel_size - 1) * pc.tensor_parallel_size
        self._encoder = DriverScheduleEncoder(self.vllm_config.model_config.get_vocab_size())
        self._tmpdir = tempfile.mkdtemp(prefix="vllm_volta_dist_")
        init_method = (Path(self._tmpdir) / "rendezvous").as_uri()
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        self._conns, self._procs = [], []
        for rank in range(1, world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, name=f"vllm-volta-rank{rank}", daemon=True,
                               args=(self.vllm_config, rank, world_size, init_method, child))
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        self._finalizer = weakref.finalize(self, _terminate, self._procs, self._tmpdir)
        logger.info("Tensor parallel %d x pipeline parallel %d: %d ranks (driver + %d worker processes)%s",
                    pc.tensor_parallel_size, pc.pipeline_parallel_size, world_size, world_size - 1,
                    f"; rank {self._sampler} samples" if self._sampler else "")
        self.worker: Worker | None = None
        try:
            self.worker = Worker(self.vllm_config, 0, world_size, init_method)
            self.worker.load_model()
            self._collect(timeout=_READY_TIMEOUT_S)
        except BaseException:
            if self.worker is not None:
                self.worker.shutdown()
                self.worker = None
            self._finalizer()  # stop the worker processes
            raise

    def _collect(self, timeout: float | None = None) -> list[Any]:
        results, errors = [], []
        for conn, proc in zip(self._conns, self._procs):
            if not conn.poll(timeout):
                errors.append(f"{proc.name} did not answer (alive: {proc.is_alive()})")
                continue
            status, value = conn.recv()
            (results if status == "ok" else errors).append(value)
        if errors:
            raise RuntimeError("tensor-parallel worker failure: " + "; ".join(errors))
        return results

    def _run_all(self, method: str, *args: Any) -> Any:
        """Call `method` on every rank (workers first: the ranks meet in collectives)."""
        if self.worker is None:
            raise RuntimeError("the engine has been shut down; build a new one")
        message = pickle.dumps((method, args))
        for conn in self._conns:
            conn.send_bytes(message)
        result = getattr(self.worker, method)(*args)
        self._collect()
        return result

    def determine_num_available_blocks(self) -> int:
        return self._run_all("determine_num_available_blocks")

    def initialize_cache(self, num_blocks: int) -> None:
        self._run_all("initialize_cache", num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> _RanksPending:
        """Launch a step on every rank. With async scheduling the driver's sampled ids reach
        the other ranks on the device (ModelRunner._share_sampled_ids), so the next step can
        launch before this one's result is read; the ranks' answers are read with it."""
        if self.worker is None:
            raise RuntimeError("the engine has been shut down; build a new one")
        message = pickle.dumps(("execute_model", (slim_scheduler_output(scheduler_output),)))
        if not self._sampler:
            for conn in self._conns:
                conn.send_bytes(message)
            return _RanksPending(self.worker.execute_model_async(scheduler_output), self._collect)
        try:
            step = pickle.dumps(("execute_driver_step", (self._encoder.encode(scheduler_output),)))
        except BaseException:
            self._encoder.reset()
            raise
        for rank, conn in enumerate(self._conns, start=1):
            conn.send_bytes(step if rank == self._sampler else message)
        # The driver runs the first stage's layers; its own answer is empty.
        return _RanksPending(self.worker.execute_model_async(scheduler_output), self._collect_step,
                             self._sampler)

    def _collect_step(self) -> list[Any]:
        try:
            return self._collect()
        except BaseException:
            self._encoder.reset()  # the sampling rank may or may not have taken the step's deltas
            raise

    def shutdown(self) -> None:
        if self.worker is None:
            return
        message = pickle.dumps(("shutdown", ()))
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                conn.send_bytes(message)
        try:
            self._collect(timeout=30)
        except RuntimeError as e:
            logger.warning("%s", e)
        self.worker.shutdown()
        self.worker = None
        self._finalizer()
