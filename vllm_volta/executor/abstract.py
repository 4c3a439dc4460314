"""Executor: the engine's only handle on the model, wherever (and on how many devices) it runs.

UniProcExecutor (one device, this process), MultiprocExecutor (tensor parallelism, one
process per device) and RayExecutor (one Ray actor per device, across nodes) implement it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from vllm_volta.config import VllmConfig
from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.worker.model_runner import ModelRunnerOutput, PendingOutput


class Executor(ABC):
    """Owns the workers. Call order: determine_num_available_blocks -> initialize_cache ->
    execute_model (every step) -> shutdown."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self._init_executor()

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type[Executor]:
        """distributed_executor_backend="ray": RayExecutor (Ray actors, any number of nodes);
        else one device: UniProcExecutor; tensor parallelism: MultiprocExecutor."""
        if vllm_config.parallel_config.distributed_executor_backend == "ray":
            from vllm_volta.executor.ray_executor import RayExecutor
            return RayExecutor
        if vllm_config.parallel_config.world_size > 1:
            from vllm_volta.executor.multiproc import MultiprocExecutor
            return MultiprocExecutor
        from vllm_volta.executor.uniproc import UniProcExecutor
        return UniProcExecutor

    @abstractmethod
    def _init_executor(self) -> None:
        """Start the workers and load the model."""

    @abstractmethod
    def determine_num_available_blocks(self) -> int:
        """Number of KV-cache blocks every worker can hold (the minimum over workers)."""

    @abstractmethod
    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate `num_blocks` KV blocks on every worker (and capture CUDA graphs)."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduled step; returns the sampled tokens (from the driver worker)."""

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Launch one step; its result() gives the output. Executors that cannot overlap
        the host with the device finish the step here."""
        return PendingOutput(self.execute_model(scheduler_output))

    def shutdown(self) -> None:
        """Release workers and device memory."""
