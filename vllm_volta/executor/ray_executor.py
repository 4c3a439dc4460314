"""RayExecutor: tensor and pipeline parallelism with one Ray actor per device, on any node of a
Ray cluster.

`--distributed-executor-backend ray`. The engine process connects to the Ray cluster the user
started (`ray start --head` / `ray start --address`), or starts a local Ray instance when none
is running. A placement group reserves one bundle per rank ({"GPU": 1} on GPUs, {"CPU": 1} on
CPUs); each bundle holds an actor that hosts one rank's Worker. The ranks meet in
torch.distributed (NCCL on GPUs, gloo on CPUs) through a TCP store on rank 0's node, which is
the engine's node when it has a bundle. All ranks are actors: the engine process holds no
device. Rank r is TP rank r % tp of pipeline stage r // tp (as in MultiprocExecutor). The
sampling rank (rank 0, the driver, without pipeline parallelism; else TP rank 0 of the last
stage) produces the step's output; it keeps copies of the requests, updated by deltas
(ray_request_sync.py); the others get the slim schedule MultiprocExecutor sends its workers. Calls and answers are dataclasses (WorkerInit, DriverStep,
SchedulerOutput, ModelRunnerOutput), pickled by Ray.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.executor.abstract import Executor
from vllm_volta.executor.multiproc import slim_scheduler_output
from vllm_volta.executor.ray_messages import WorkerInit
from vllm_volta.executor.ray_request_sync import DriverScheduleEncoder
from vllm_volta.executor.ray_utils import (RayWorkerActor, assign_ranks, forwarded_env,
                                           import_ray, tcp_init_method)
from vllm_volta.logger import init_logger
from vllm_volta.worker.model_runner import ModelRunnerOutput

logger = init_logger(__name__)

_READY_TIMEOUT_S = 600.0  # model loading on every rank
_PLACEMENT_TIMEOUT_S = 120.0  # the cluster has the resources but is still starting nodes
_SHUTDOWN_TIMEOUT_S = 30.0
_FAILURE_GRACE_S = 1.0


class _RayPending:
    """A step launched on every rank; result() waits for all of them and returns the sampling
    rank's answer."""

    def __init__(self, collect: Callable[[], list[Any]], sampler: int = 0) -> None:
        self._collect: Callable[[], list[Any]] | None = collect
        self._sampler = sampler
        self._output: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        if self._collect is not None:
            collect, self._collect = self._collect, None
            self._output = collect()[self._sampler]
        return self._output


class RayExecutor(Executor):
    # Whether this process's Ray connection was opened by a RayExecutor, and how many live
    # executors use it: the last to shut down closes it (not one engine under another's feet).
    _started_ray: bool = False
    _on_started_ray: int = 0

    def _init_executor(self) -> None:
        self._ray = ray = import_ray()
        pc = self.vllm_config.parallel_config
        self.world_size = pc.world_size
        # The rank that samples: TP rank 0 of the last pipeline stage (Worker.sampler_rank).
        self._sampler = (pc.pipeline_parallel_size - 1) * pc.tensor_parallel_size
        self.workers: list[Any] = []  # actor handles, by rank
        self._ranks_ips: list[str] = []
        self._broken: str | None = None  # why the group can no longer run a step
        self._pg, self._owns_pg = None, False
        self._encoder = DriverScheduleEncoder(self.vllm_config.model_config.get_vocab_size())
        if not ray.is_initialized():
            # Connects to a running cluster (RAY_ADDRESS, or one started on this node with
            # `ray start`), else starts a local instance.
            ray.init()
            RayExecutor._started_ray, RayExecutor._on_started_ray = True, 0
        self._owns_ray = RayExecutor._started_ray
        RayExecutor._on_started_ray += self._owns_ray
        try:
            self._start_actors()
            self._run_all("init_worker", self._init_messages(), timeout=_READY_TIMEOUT_S)
        except BaseException:
            self._teardown(graceful=False)
            raise

    # ---- start-up -----------------------------------------------------------------
    def _placement_group(self, resource: str) -> Any:
        """The current placement group when the engine runs inside one, else a new one."""
        from ray.util.placement_group import get_current_placement_group, placement_group
        ray, n = self._ray, self.world_size
        pc = self.vllm_config.parallel_config
        sizes = f"tensor_parallel_size={pc.tensor_parallel_size}" + (
            f" x pipeline_parallel_size={pc.pipeline_parallel_size}" if pc.pipeline_parallel_size > 1 else "")
        current = get_current_placement_group()
        if current is not None:
            bundles = [b for b in current.bundle_specs if b.get(resource, 0) >= 1]
            if len(bundles) < n:
                raise ValueError(f"The current Ray placement group has {len(bundles)} bundles "
                                 f"with a {resource}; {sizes} needs {n}")
            return current
        available = ray.cluster_resources().get(resource, 0)
        if available < n:
            raise ValueError(
                f"{sizes} needs {n} {resource}s in the Ray cluster, which has "
                f"{int(available)}; allowed range is [1, {int(available)}] (add nodes with "
                f"`ray start --address=HEAD_IP:6379`)")
        pg = placement_group([{resource: 1}] * n, strategy="PACK")
        self._owns_pg = True
        ready, _ = ray.wait([pg.ready()], timeout=_PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RuntimeError(
                f"Ray could not place {n} bundles of {{{resource!r}: 1}} within "
                f"{_PLACEMENT_TIMEOUT_S:.0f} s; free: {ray.available_resources()}")
        return pg

    def _start_actors(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        ray = self._ray
        on_gpu = self.vllm_config.device_config.device == "cuda"
        resource = "GPU" if on_gpu else "CPU"
        self._pg = self._placement_group(resource)
        indices = [i for i, b in enumerate(self._pg.bundle_specs)
                   if b.get(resource, 0) >= 1][:self.world_size]
        actor_cls = ray.remote(RayWorkerActor)
        env = forwarded_env()
        actors = []
        for bundle in indices:
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=True)
            actors.append(actor_cls.options(
                num_gpus=1 if on_gpu else 0, num_cpus=0 if on_gpu else 1,
                scheduling_strategy=strategy, max_restarts=0,
                runtime_env={"env_vars": env} if env else None).remote())
        self.workers = actors  # until ranks are known: killed on a failed start
        infos = ray.get([a.node_info.remote() for a in actors], timeout=_READY_TIMEOUT_S)
        self._placements = assign_ranks(infos, ray.util.get_node_ip_address())
        self.workers = [actors[p.actor_index] for p in self._placements]
        self._ranks_ips = [p.node_ip for p in self._placements]
        port = ray.get(self.workers[0].free_port.remote(), timeout=_READY_TIMEOUT_S)
        self._init_method = tcp_init_method(self._placements[0].node_ip, port)
        nodes = sorted(set(self._ranks_ips))
        logger.info("Ray executor: %d ranks (one actor per %s) on %d node(s) %s; "
                    "torch.distributed (%s) rendezvous at %s", self.world_size, resource,
                    len(nodes), ", ".join(nodes), "nccl" if on_gpu else "gloo",
                    self._init_method)

    def _init_messages(self) -> list[tuple]:
        return [(WorkerInit(self.vllm_config, p.rank, self.world_size, self._init_method,
                            p.cuda_visible_devices, p.local_device),)
                for p in self._placements]

    # ---- calls on every rank ------------------------------------------------------
    def _submit(self, method: str, per_rank_args: list[tuple],
                driver_method: str | None = None) -> list[Any]:
        """Call `method` on every rank (`driver_method` on the sampling rank when given)."""
        if not self.workers:
            raise RuntimeError("the engine has been shut down; build a new one")
        if self._broken is not None:
            raise RuntimeError(f"tensor-parallel worker failure: the group is broken "
                               f"({self._broken}); build a new engine")
        methods = [method] * self.world_size
        methods[self._sampler] = driver_method or method
        return [getattr(w, m).remote(*args)
                for w, m, args in zip(self.workers, methods, per_rank_args)]

    def _gather(self, refs: list[Any], method: str, timeout: float | None = None) -> list[Any]:
        """Every rank's answer, by rank. A failed rank (dead actor or an exception) fails the
        call at once: the others may be blocked in a collective waiting for it."""
        ray = self._ray
        results: list[Any] = [None] * len(refs)
        rank_of = {ref: r for r, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                late = sorted(rank_of[r] for r in pending)
                self._broken = f"rank(s) {late} did not answer {method} within {timeout:.0f} s"
                raise RuntimeError(f"tensor-parallel worker failure: {self._broken}")
            try:
                results[rank_of[ready[0]]] = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                # A dead peer also breaks the others' collective: give their errors a moment
                # to arrive, so the message names the rank that died, not only its victims.
                more, rest = ray.wait(pending, num_returns=len(pending), timeout=_FAILURE_GRACE_S)
                raise self._failure([ready[0], *more], not rest, rank_of, method) from None
        return results

    def _failure(self, refs: list[Any], all_answered: bool, rank_of: dict[Any, int],
                 method: str) -> BaseException:
        """The error for a failed call. The driver's own exception, as is, when only it failed
        and every other rank finished the step (the group is intact, as when a MultiprocExecutor
        driver raises); else one error naming every failed rank, the dead ones first, and the
        group is marked broken (the engine treats it as fatal)."""
        ray = self._ray
        dead: dict[int, str] = {}
        failed: dict[int, BaseException] = {}
        for ref in refs:
            r = rank_of[ref]
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
                dead[r] = (f"rank {r} (Ray actor on {self._ranks_ips[r]}) died during {method}: "
                           f"{type(e).__name__} {first_line}")
            except ray.exceptions.RayTaskError as e:
                failed[r] = e.cause if e.cause is not None else e
        if not dead and list(failed) == [self._sampler] and all_answered and method == "execute_model":
            return failed[self._sampler]
        self._broken = (f"rank(s) {sorted(dead)} died" if dead
                        else f"rank(s) {sorted(failed)} failed")
        parts = [dead[r] for r in sorted(dead)] + [
            f"rank {r}: {method} failed: {type(e).__name__}: {e}" for r, e in sorted(failed.items())]
        return RuntimeError("tensor-parallel worker failure: " + "; ".join(parts))

    def _run_all(self, method: str, per_rank_args: list[tuple] | None = None,
                 timeout: float | None = None) -> list[Any]:
        args = per_rank_args if per_rank_args is not None else [()] * self.world_size
        return self._gather(self._submit(method, args), method, timeout)

    def determine_num_available_blocks(self) -> int:
        # Equal on every rank (minima over ranks). No worker runs in this process: the engine's
        # config takes the state slots / max_num_seqs that sizing may have capped.
        num_blocks, slots, max_num_seqs = self._run_all("determine_num_available_blocks")[0]
        self.vllm_config.cache_config.num_state_slots = slots
        self.vllm_config.scheduler_config.max_num_seqs = max_num_seqs
        return num_blocks

    def initialize_cache(self, num_blocks: int) -> None:
        layouts = self._run_all("initialize_cache", [(num_blocks,)] * self.world_size)
        # No worker runs in this process: the scheduler hands out blocks by rank 0's KV-cache
        # layout (the groups of its layers; every rank plans the same).
        self.vllm_config.scheduler_config.kv_cache_layout = layouts[0]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> _RayPending:
        """Launch a step on every rank; the engine may schedule (and launch) the next step
        before reading this one (each actor runs its steps in launch order)."""
        args = [(slim_scheduler_output(scheduler_output),)] * self.world_size
        try:
            args[self._sampler] = (self._encoder.encode(scheduler_output),)
            refs = self._submit("execute_model", args, "execute_driver_step")
        except BaseException:
            self._encoder.reset()
            raise
        return _RayPending(lambda: self._collect_step(refs), self._sampler)

    def _collect_step(self, refs: list[Any]) -> list[Any]:
        try:
            return self._gather(refs, "execute_model")
        except BaseException:
            self._encoder.reset()  # rank 0 may or may not have taken the step's deltas
            raise

    # ---- shutdown -------------------------------------------------------------------
    def shutdown(self) -> None:
        if not self.workers:
            return
        self._teardown(graceful=self._broken is None)

    def _teardown(self, graceful: bool) -> None:
        """Release the ranks' process groups (when they can still answer), then the actors,
        the placement group and the Ray connection this executor opened. Ranks stuck in a
        collective with a dead peer are killed, not waited for."""
        ray, workers = self._ray, self.workers
        self.workers = []
        if graceful and workers:
            refs = [w.shutdown.remote() for w in workers]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_SHUTDOWN_TIMEOUT_S)
            if len(ready) < len(refs):
                logger.warning("Ray executor: %d rank(s) did not shut down within %.0f s; "
                               "killing them", len(refs) - len(ready), _SHUTDOWN_TIMEOUT_S)
        for w in workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception as e:  # already gone
                logger.debug("ray.kill: %s", e)
        if self._owns_pg and self._pg is not None:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(self._pg)
            self._pg, self._owns_pg = None, False
        if self._owns_ray:
            self._owns_ray = False
            RayExecutor._on_started_ray -= 1
            if RayExecutor._on_started_ray == 0 and ray.is_initialized():
                ray.shutdown()
                RayExecutor._started_ray = False
