"""Worker: one device. Sets it up, loads the model, sizes and owns the KV cache."""
from __future__ import annotations

import gc

import torch

from vllm_volta.config import VllmConfig
from vllm_volta.core.kv_cache_groups import KVCacheLayout
from vllm_volta.core.scheduler import SchedulerOutput
from vllm_volta.logger import init_logger
from vllm_volta.worker.model_runner import ModelRunner, ModelRunnerOutput, PendingOutput

logger = init_logger(__name__)

_UNBOUNDED = 1 << 62  # a count this rank does not limit (the minimum over ranks decides)


class Worker:
    """Runs the model (or, with tensor parallelism, rank `rank`'s shard of it) on one device.

    With world_size > 1 every rank joins one torch.distributed group (NCCL on GPUs, gloo on
    CPUs) through `distributed_init_method`; rank r uses GPU r. Rank r is TP rank r % tp of
    pipeline stage r // tp; TP rank 0 of the last stage (rank 0 without pipeline parallelism)
    is the only one that samples.
    """

    def __init__(self, vllm_config: VllmConfig, rank: int = 0, world_size: int = 1,
                 distributed_init_method: str | None = None) -> None:
        self.vllm_config = vllm_config
        self.rank, self.world_size = rank, world_size
        device_type = vllm_config.device_config.device
        self.device = (torch.device("cuda", rank) if device_type == "cuda"
                       else torch.device("cpu"))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if world_size > 1:
            self._init_distributed(distributed_init_method)
        # Unseeded random sampling draws from the global generator: seed it like vLLM.
        torch.manual_seed(vllm_config.model_config.seed)
        self.model_runner = ModelRunner(vllm_config, self.device, is_driver=rank == self.sampler_rank)

    @property
    def sampler_rank(self) -> int:
        """The rank that samples: TP rank 0 of the last pipeline stage."""
        pc = self.vllm_config.parallel_config
        return (pc.pipeline_parallel_size - 1) * pc.tensor_parallel_size

    def _init_distributed(self, init_method: str | None) -> None:
        import torch.distributed as dist

        from vllm_volta.model_executor.layers.parallel_state import init_model_parallel
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=self.rank,
                                world_size=self.world_size)
        pc = self.vllm_config.parallel_config
        init_model_parallel(pc.tensor_parallel_size, self.world_size // pc.tensor_parallel_size)

    def shutdown(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            from vllm_volta.model_executor.layers.parallel_state import destroy_model_parallel
            if dist.is_initialized():
                dist.destroy_process_group()
            destroy_model_parallel()

    def load_model(self) -> None:
        self.model_runner.load_model()

    def determine_num_available_blocks(self) -> int:
        """How many KV blocks fit: free GPU memory after a profiling step x utilization on
        a GPU, the CPU byte budget on a CPU; capped at what the scheduler could ever use."""
        cache_config = self.vllm_config.cache_config
        block_bytes = self.model_runner.kv_cache_block_bytes()
        if cache_config.num_gpu_blocks_override is not None:
            return cache_config.num_gpu_blocks_override
        if self.device.type == "cuda":
            budget = self._profile_gpu_kv_bytes()
            what = (f"gpu_memory_utilization={cache_config.gpu_memory_utilization} leaves "
                    f"{budget / 2**30:.2f} GiB")
        else:
            budget = cache_config.cpu_kvcache_bytes()
            what = f"the CPU KV-cache budget is {budget / 2**30:.2f} GiB"
        if cache_config.num_state_slots:  # every rank alike (a pipeline stage may hold no state)
            budget -= self._size_state_pool(budget, what)
        # A pipeline stage with no paged layer holds no block: the other stages set the count.
        num_blocks = budget // block_bytes if block_bytes else _UNBOUNDED
        if self.world_size > 1:  # every rank must hold the same number of blocks
            num_blocks = self._min_over_ranks(num_blocks)
        if num_blocks < 2:
            raise ValueError(
                f"No room for the KV cache: {what}, one block needs {block_bytes} bytes. "
                f"Raise gpu_memory_utilization (GPU) or cpu_kvcache_space / "
                f"VLLM_VOLTA_CPU_KVCACHE_SPACE (CPU), or use a smaller model.")
        sc = self.vllm_config.scheduler_config
        layout = self.model_runner.kv_cache_layout()
        useful = sc.max_num_seqs * layout.blocks_per_request(sc.max_model_len, sc.max_num_batched_tokens) + 1
        return int(min(num_blocks, useful))

    def _size_state_pool(self, budget: int, what: str) -> int:
        """Hybrid models: the recurrent-state pool takes at most half of the KV budget (the rest
        holds the attention layers' KV); where max_num_seqs requests' states do not fit that,
        max_num_seqs is capped to what does, with a warning. Returns the pool's bytes."""
        cache_config, sc = self.vllm_config.cache_config, self.vllm_config.scheduler_config
        slots = cache_config.num_state_slots
        per_slot = self.model_runner.state_pool_bytes() // slots
        fit = int(budget // 2 // per_slot) if per_slot else _UNBOUNDED
        if self.world_size > 1:  # every rank must keep the same requests
            fit = self._min_over_ranks(fit)
        if fit < 2:
            raise ValueError(
                f"No room for the recurrent state of even one request ({per_slot / 2**30:.3f} GiB "
                f"each, at most half of the budget): {what}. Raise gpu_memory_utilization / "
                f"cpu_kvcache_space, or use a smaller model.")
        if fit < slots:
            logger.warning("max_num_seqs capped from %d to %d: the recurrent state of a request takes "
                           "%.1f MiB and the state pool may take at most half of the KV budget (%s)",
                           sc.max_num_seqs, fit - 1, per_slot / 2**20, what)
            slots = cache_config.num_state_slots = fit
            sc.max_num_seqs = fit - 1
        logger.info("Recurrent-state pool: %d slots (max_num_seqs %d + 1 scratch), %.3f GiB taken from "
                    "the KV-cache budget", slots, slots - 1, per_slot * slots / 2**30)
        return per_slot * slots

    def _min_over_ranks(self, value: int) -> int:
        import torch.distributed as dist
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def _profile_gpu_kv_bytes(self) -> int:
        util = self.vllm_config.cache_config.gpu_memory_utilization
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.model_runner.profile_run()
        torch.cuda.synchronize(self.device)
        peak_torch = torch.cuda.max_memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        # Memory held outside torch's allocator (CUDA context, other processes).
        non_torch = (total - free) - torch.cuda.memory_reserved(self.device)
        gc.collect()
        torch.cuda.empty_cache()
        budget = int(total * util) - peak_torch - max(non_torch, 0)
        logger.info("Memory profile: total %.2f GiB, peak torch %.2f GiB, non-torch %.2f GiB",
                    total / 2**30, peak_torch / 2**30, non_torch / 2**30)
        return max(budget, 0)

    def initialize_cache(self, num_blocks: int) -> KVCacheLayout:
        """Allocate the cache (and capture graphs). Returns the KV-cache layout, which the
        scheduler must hand out blocks by: it is also put on this config's scheduler_config
        (``kv_cache_layout``), which is the engine's own where this worker runs in its process;
        an executor whose ranks run elsewhere sets it from this return value."""
        self.vllm_config.cache_config.num_gpu_blocks = num_blocks
        layout = self.model_runner.kv_cache_layout()
        self.vllm_config.scheduler_config.kv_cache_layout = layout
        self.model_runner.initialize_kv_caches(num_blocks)
        if self.rank == 0:
            self._log_cache(num_blocks)
        self._maybe_capture_cuda_graphs(self.vllm_config.scheduler_config.max_num_seqs)
        return layout

    def _log_cache(self, num_blocks: int) -> None:
        mc = self.vllm_config.model_config
        layout = self.model_runner.kv_cache_layout()
        block_size = layout.groups[0].block_size
        # Blocks a max_model_len request holds at most in every group (sliding groups: their
        # window plus a step's tokens).
        per_request = layout.blocks_per_request(mc.max_model_len,
                                                self.vllm_config.scheduler_config.max_num_batched_tokens)
        if layout.num_groups > 1:
            from vllm_volta.worker.kv_groups import describe
            blocks = f"{num_blocks} blocks, {describe(layout)}"
        else:
            blocks = f"{num_blocks} blocks of {block_size} tokens ({(num_blocks - 1) * block_size} tokens"
            blocks += ", sliding window)" if layout.frees_blocks else ")"
        pc = self.vllm_config.parallel_config
        tp = f" | tensor parallel {pc.tensor_parallel_size}" if pc.tensor_parallel_size > 1 else ""
        if pc.pipeline_parallel_size > 1:
            tp += f" | pipeline parallel {pc.pipeline_parallel_size} (stage 0's cache)"
        logger.info(
            "Model %s | dtype %s | attention backend %s%s | KV cache%s: %s, %.2f GiB per device | "
            "max concurrency for %d-token requests: %.2fx",
            mc.served_model_name, str(mc.dtype).removeprefix("torch."),
            getattr(self.model_runner.attn_backend, "name", "?"), tp,
            "" if (kv := self.vllm_config.cache_config.kv_cache_dtype) == "auto" else f" ({kv})", blocks,
            num_blocks * self.model_runner.kv_cache_block_bytes() / 2**30,
            mc.max_model_len, (num_blocks - 1) / per_request)
        if per_request > num_blocks - 1:
            logger.warning("A max_model_len=%d request needs %d KV-cache blocks, the cache has %d: "
                           "longer requests will finish with an error", mc.max_model_len, per_request,
                           num_blocks - 1)

    def _maybe_capture_cuda_graphs(self, max_num_seqs: int) -> None:
        runner = self.model_runner
        if (self.device.type != "cuda" or self.vllm_config.model_config.enforce_eager):
            return
        if self.world_size > 1:
            # torch.distributed collectives inside captured graphs are not relied on yet.
            logger.info("CUDA graphs off with %d ranks (tensor x pipeline parallel)", self.world_size)
            return
        if not getattr(runner.model, "supports_cuda_graphs", True):
            logger.info("CUDA graphs off: %s routes tokens to experts in shapes that change every step",
                        type(runner.model).__name__)
            return
        if not getattr(runner.attn_backend, "supports_cuda_graphs", False):
            logger.info("CUDA graphs off: attention backend %s cannot be captured",
                        getattr(runner.attn_backend, "name", "?"))
            return
        from vllm_volta.worker.cuda_graph import CudaGraphRunner
        runner.graph_runner = CudaGraphRunner.capture(runner, max_num_seqs)
        # A model whose layers the pieces cannot be cut around says why (class attribute).
        no_pieces = getattr(runner.model, "piecewise_graphs_off", None)
        if self.vllm_config.cache_config.num_state_slots:
            no_pieces = "its linear-attention layers run their prefill per sequence"
        if no_pieces and self.vllm_config.model_config.cudagraph_mode == "FULL_AND_PIECEWISE":
            logger.info("Piecewise CUDA graphs off for %s: %s; decode steps replay full graphs",
                        type(runner.model).__name__, no_pieces)
        elif self.vllm_config.model_config.cudagraph_mode == "FULL_AND_PIECEWISE":
            from vllm_volta.worker.piecewise_graph import PiecewiseGraphRunner
            runner.piecewise_runner = PiecewiseGraphRunner.capture(
                runner, self.vllm_config.scheduler_config.max_num_batched_tokens,
                runner.graph_runner.pool)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        return self.model_runner.execute_model_async(scheduler_output)
