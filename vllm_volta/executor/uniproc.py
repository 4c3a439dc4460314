"""UniProcExecutor: one worker in this process, on one device."""
from __future__ import annotations

from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.executor.abstract import Executor
from vllm_volta.worker.model_runner import ModelRunnerOutput, PendingOutput
from vllm_volta.worker.worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        self.worker: Worker | None = Worker(self.vllm_config)
        self.worker.load_model()

    def determine_num_available_blocks(self) -> int:
        return self.worker.determine_num_available_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        if self.worker is None:
            raise RuntimeError("the engine has been shut down; build a new one")
        return self.worker.execute_model_async(scheduler_output)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            runner = self.worker.model_runner
            runner.kv_caches.clear()
            runner.graph_runner = None
            runner.model = None
            self.worker = None
