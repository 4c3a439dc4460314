"""The Ray side of RayExecutor: importing Ray, placing ranks on nodes, and the actor that
hosts one rank's Worker (its messages: ray_messages.py).

Nothing here imports Ray at module level (it is an optional dependency); the actor class is a
plain class that RayExecutor wraps with ``ray.remote``.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_volta.config import VllmConfig
from vllm_volta.core.kv_cache_groups import KVCacheLayout
from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.worker.model_runner import ModelRunner, ModelRunnerOutput
from vllm_volta.executor.ray_messages import DriverStep, WorkerInit
from vllm_volta.executor.ray_request_sync import RankZeroRequests
from vllm_volta.worker.worker import Worker

RAY_INSTALL_HINT = 'pip install -e ".[ray]"'

# Environment a rank must see as the engine does, wherever Ray starts it. OMP_NUM_THREADS: Ray
# gives a CPU rank's actor one thread per reserved CPU (one) unless told otherwise.
_FORWARDED_ENV_PREFIXES = ("VLLM_VOLTA_", "VLLM_PP_", "NCCL_", "GLOO_", "HF_", "TRANSFORMERS_",
                           "TORCH_", "OMP_")


def import_ray() -> Any:
    """The ray module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            f"distributed_executor_backend='ray' needs Ray, which is not installed: "
            f"{RAY_INSTALL_HINT} (or pip install 'ray[default]>=2.9'), on every node") from e
    return ray


def forwarded_env() -> dict[str, str]:
    """The engine's settings that ranks on other nodes must share (VLLM_VOLTA_*, NCCL_*...).
    Secrets (HF_TOKEN and the like) stay behind: Ray shows an actor's environment in its
    dashboard and state API."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(_FORWARDED_ENV_PREFIXES) and "TOKEN" not in k and "KEY" not in k}


@dataclass
class NodeInfo:
    """Where Ray put one actor: its node and the GPU ids Ray gave it."""

    node_id: str
    node_ip: str
    gpu_ids: list[str] = field(default_factory=list)


@dataclass
class Placement:
    """One rank's place: which actor, which node, and how it sees its GPU."""

    actor_index: int
    rank: int
    node_ip: str
    cuda_visible_devices: str | None  # every GPU of this executor on the node, sorted
    local_device: int  # index of this rank's GPU within cuda_visible_devices


def _gpu_sort_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), "") if gpu_id.isdigit() else (1 << 30, gpu_id)


def assign_ranks(infos: list[NodeInfo], driver_ip: str) -> list[Placement]:
    """Ranks in order: the engine's node first (rank 0, whose TCP store every rank dials, and
    whose sampled tokens the engine reads, stays local), then the other nodes by IP; within a
    node by GPU id. Consecutive ranks on one node keep the all-reduce's traffic on that node's
    links. Every rank on a node sees all of the node's GPUs of this executor (NCCL can then
    use peer-to-peer copies between them) and picks its own by index."""
    order = sorted(range(len(infos)), key=lambda i: (
        infos[i].node_ip != driver_ip, infos[i].node_ip, infos[i].node_id,
        [_gpu_sort_key(g) for g in infos[i].gpu_ids]))
    node_gpus: dict[str, list[str]] = {}
    for info in infos:
        node_gpus.setdefault(info.node_id, []).extend(info.gpu_ids)
    placements = []
    for rank, i in enumerate(order):
        info = infos[i]
        if info.gpu_ids:
            gpus = sorted(set(node_gpus[info.node_id]), key=_gpu_sort_key)
            visible, local = ",".join(gpus), gpus.index(info.gpu_ids[0])
        else:
            visible, local = None, 0
        placements.append(Placement(i, rank, info.node_ip, visible, local))
    return placements


def tcp_init_method(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"tcp://{host}:{port}"


class RayWorker(Worker):
    """A Worker whose GPU is given by index on its node (a Ray node's ranks do not start at
    0), instead of by rank as on one node."""

    def __init__(self, vllm_config: VllmConfig, rank: int, world_size: int,
                 distributed_init_method: str, local_device: int) -> None:
        # Mirrors Worker.__init__ with the device index decoupled from the rank.
        self.vllm_config = vllm_config
        self.rank, self.world_size = rank, world_size
        on_gpu = vllm_config.device_config.device == "cuda"
        self.device = torch.device("cuda", local_device) if on_gpu else torch.device("cpu")
        if on_gpu:
            torch.cuda.set_device(self.device)
        if world_size > 1:
            self._init_distributed(distributed_init_method)
        torch.manual_seed(vllm_config.model_config.seed)
        self.model_runner = ModelRunner(vllm_config, self.device, is_driver=rank == self.sampler_rank)


class RayWorkerActor:
    """Hosts one rank in a Ray actor. Calls run one at a time in the order the executor sent
    them (a Ray actor's default), which is the order the ranks' collectives need."""

    def __init__(self) -> None:
        self.worker: RayWorker | None = None
        self.requests = RankZeroRequests()  # used on rank 0 only

    def node_info(self) -> NodeInfo:
        import ray
        ctx = ray.get_runtime_context()
        return NodeInfo(ctx.get_node_id(), ray.util.get_node_ip_address(),
                        [str(g) for g in ray.get_gpu_ids()])

    def free_port(self) -> int:
        """A TCP port free on this node (rank 0's actor serves the rendezvous store on it)."""
        import ray
        ip = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
            return s.getsockname()[1]

    def init_worker(self, init: WorkerInit) -> None:
        local_device = init.local_device
        if init.cuda_visible_devices is not None:
            if torch.cuda.is_initialized():  # too late to widen the view: Ray's one GPU
                local_device = 0
            else:  # the node's GPUs of this engine, not only Ray's one (NCCL peer copies)
                os.environ["CUDA_VISIBLE_DEVICES"] = init.cuda_visible_devices
        self.worker = RayWorker(init.vllm_config, init.rank, init.world_size,
                                init.distributed_init_method, local_device)
        self.worker.load_model()

    def determine_num_available_blocks(self) -> tuple[int, int, int]:
        """(KV blocks, recurrent-state slots, max_num_seqs): sizing may cap the last two."""
        num_blocks = self.worker.determine_num_available_blocks()
        config = self.worker.vllm_config
        return num_blocks, config.cache_config.num_state_slots, config.scheduler_config.max_num_seqs

    def initialize_cache(self, num_blocks: int) -> KVCacheLayout:
        from vllm_volta.engine.gc_policy import freeze_startup_heap, raise_gc_threshold
        layout = self.worker.initialize_cache(num_blocks)
        # As in a multiproc rank: the built rank's heap leaves the collector's sight, so a
        # full collection does not stall the collectives of a step.
        raise_gc_threshold()
        freeze_startup_heap()
        return layout

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def execute_driver_step(self, step: DriverStep) -> ModelRunnerOutput:
        """Rank 0's step: its copies of the requests brought up to date, then run."""
        return self.worker.execute_model(self.requests.decode(step))

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None
