"""Executor: the engine's only handle on the model, wherever (and on how many devices) it runs.

Tensor parallelism (one worker process per GPU) and multi-node executors implement this
same interface, so the engine does not change when they arrive.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from vllm_volta.config import VllmConfig
from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.worker.model_runner import ModelRunnerOutput


class Executor(ABC):
    """Owns the workers. Call order: determine_num_available_blocks -> initialize_cache ->
    execute_model (every step) -> shutdown."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self._init_executor()

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type[Executor]:
        """The executor for the parallel config (only a single device exists today)."""
        world_size = vllm_config.parallel_config.world_size
        if world_size != 1:
            raise ValueError(f"tensor_parallel_size x pipeline_parallel_size = {world_size} is "
                             f"not supported yet; allowed value is 1")
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

    def shutdown(self) -> None:
        """Release workers and device memory."""
