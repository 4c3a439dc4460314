"""EngineArgs: the user-facing engine options (vLLM's names) -> VllmConfig."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from vllm_volta.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,
                               SchedulerConfig, VllmConfig)

# (max_num_seqs, max_num_batched_tokens) defaults. A CPU has far less compute per step than
# a GPU. GPUs of >= 70 GiB other than the A100 get vLLM's larger defaults there (a bigger
# decode batch amortizes the weight reads; vLLM measured the larger token budget slower on
# A100s); V100s, T4s and other GPUs keep 256 / 8192.
_CPU_BATCH_DEFAULTS = (128, 2048)
_GPU_BATCH_DEFAULTS = (256, 8192)
_LARGE_GPU_BATCH_DEFAULTS = (1024, 16384)
_LARGE_GPU_MEMORY = 70 * 1024**3


def default_batch_limits(device: str) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) when the user sets neither, for `device`."""
    if device == "cpu":
        return _CPU_BATCH_DEFAULTS
    from vllm_volta.platforms import current_platform
    if (current_platform.get_device_total_memory() >= _LARGE_GPU_MEMORY
            and "a100" not in current_platform.get_device_name().lower()):
        return _LARGE_GPU_BATCH_DEFAULTS
    return _GPU_BATCH_DEFAULTS

# Help strings for the CLI flags (the server and benchmarks share them).
_HELP = {
    "model": "HF folder, hub name or .gguf file; default: the built-in SmolLM2-135M-Instruct",
    "tokenizer": "tokenizer folder/name (default: the model's)",
    "dtype": "auto, half/float16, bfloat16, float/float32",
    "seed": "random seed for sampling without a per-request seed",
    "max_model_len": "context length (default: from the model config)",
    "load_format": "auto, safetensors, gguf, dummy (random weights)",
    "quantization": "the checkpoint's weight quantization, checked against it: awq, gptq, gguf "
                    "(awq_marlin / gptq_marlin are accepted and run the same kernels); default: "
                    "read from the config",
    "block_size": "tokens per KV-cache block",
    "gpu_memory_utilization": "fraction of GPU memory for weights, activations and KV cache",
    "cpu_kvcache_space": "KV-cache size in GiB on CPU (default: VLLM_VOLTA_CPU_KVCACHE_SPACE)",
    "num_gpu_blocks_override": "use exactly this many KV blocks (testing)",
    "kv_cache_dtype": "KV-cache element type: auto (the model dtype), fp8 / fp8_e4m3 (e4m3fn) or fp8_e5m2; "
                      "FP8 halves the bytes per token, scaled per layer by the checkpoint's k_scale / "
                      "v_scale where it has them, else 1.0",
    "max_num_seqs": "max sequences per step",
    "max_num_batched_tokens": "max tokens per step (the token budget)",
    "long_prefill_token_threshold": "a prompt with more tokens left than this gets at most this many "
                                    "per step (0: no limit; 4%% of max_model_len when "
                                    "max_num_partial_prefills > 1)",
    "max_num_partial_prefills": "how many prompts may be partially prefilled at once",
    "max_long_partial_prefills": "how many of those may be longer than long_prefill_token_threshold "
                                 "(fewer lets shorter prompts go first)",
    "prefill_attention_reference_len": "beside running decodes, a prompt chunk's attention work "
                                       "(tokens x (context + tokens/2)) stays within "
                                       "max_num_batched_tokens x this many keys, so chunks shrink as "
                                       "the context grows; 0 disables",
    "enforce_eager": "disable CUDA graphs",
    "async_scheduling": "schedule the next step while the current one runs on the GPU (hides "
                        "the host's per-step work; outputs come one step later)",
    "tensor_parallel_size": "number of GPUs to split the model over (tensor parallelism)",
    "pipeline_parallel_size": "number of pipeline stages, each holding consecutive decoder layers on "
                              "its own tensor_parallel_size GPUs (VLLM_PP_LAYER_PARTITION=5,3 sets the "
                              "layers per stage)",
    "distributed_executor_backend": "how tensor-parallel ranks start: mp (processes on this "
                                    "node, the default) or ray (Ray actors on the nodes of a "
                                    "Ray cluster; pip install -e \".[ray]\")",
    "enable_expert_parallel": "MoE layers: each rank holds whole experts (num_experts / "
                              "tensor_parallel_size of them) instead of a slice of every expert",
    "cudagraph_mode": "FULL_AND_PIECEWISE (CUDA graphs for decode steps, and graphs of the "
                      "pieces between attention layers for steps of up to 2048 tokens with "
                      "prompts) or FULL_DECODE_ONLY",
    "cudagraph_metrics": "log every 5 s how steps ran: token counts, padded sizes and CUDA "
                         "graph kind (FULL, PIECEWISE or NONE)",
    "cuda_graph_sizes": "decode batch sizes to capture as CUDA graphs",
    "max_seq_len_to_capture": "longest context a CUDA-graph decode step may have (else eager)",
    "disable_log_stats": "do not log throughput and KV-cache usage every 5 s",
    "generation_config": "sampling defaults for requests that leave them unset: auto (the model's "
                         "generation_config.json), vllm (vLLM's own) or a folder with one",
}


@dataclass
class EngineArgs:
    """Arguments for LLMEngine / LLM, with vLLM's field names and defaults.

    `None` for max_num_seqs / max_num_batched_tokens picks a device-dependent default.
    """

    model: str | None = None
    tokenizer: str | None = None
    revision: str | None = None
    tokenizer_revision: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    load_format: str = "auto"
    quantization: str | None = None
    served_model_name: str | None = None
    skip_tokenizer_init: bool = False
    max_logprobs: int = 20
    generation_config: str = "auto"
    # KV cache
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    cpu_kvcache_space: float | None = None
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    kv_cache_dtype: str = "auto"
    # Scheduling
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    prefill_attention_reference_len: int = 1024
    # Execution
    enforce_eager: bool = False
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    cudagraph_metrics: bool = False
    cuda_graph_sizes: list[int] | None = None
    max_seq_len_to_capture: int = 8192
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str = "mp"
    enable_expert_parallel: bool = False
    device: str = "auto"
    disable_log_stats: bool = False

    def create_engine_config(self) -> VllmConfig:
        """Validate everything and resolve model/hardware-dependent values."""
        # Cheap checks first: a bad parallel size should not wait for a model download.
        parallel_config = ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size,
                                         self.distributed_executor_backend,
                                         enable_expert_parallel=self.enable_expert_parallel)
        device_config = DeviceConfig(self.device)
        cache_config = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            cpu_kvcache_space=self.cpu_kvcache_space,
            enable_prefix_caching=self.enable_prefix_caching,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        model_config = ModelConfig(
            model=self.model, tokenizer=self.tokenizer, dtype=self.dtype, seed=self.seed,
            max_model_len=self.max_model_len, load_format=self.load_format, quantization=self.quantization,
            revision=self.revision, tokenizer_revision=self.tokenizer_revision,
            served_model_name=self.served_model_name,
            trust_remote_code=self.trust_remote_code, enforce_eager=self.enforce_eager,
            cudagraph_mode=self.cudagraph_mode, cudagraph_metrics=self.cudagraph_metrics,
            max_seq_len_to_capture=self.max_seq_len_to_capture,
            max_logprobs=self.max_logprobs, skip_tokenizer_init=self.skip_tokenizer_init,
            generation_config=self.generation_config,
        )
        default_seqs, default_tokens = default_batch_limits(device_config.device)
        max_num_seqs = self.max_num_seqs or default_seqs
        max_num_batched_tokens = self.max_num_batched_tokens
        if max_num_batched_tokens is None:
            max_num_batched_tokens = default_tokens
            if not self.enable_chunked_prefill:
                max_num_batched_tokens = max(max_num_batched_tokens, model_config.max_model_len)
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=model_config.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            cuda_graph_sizes=self.cuda_graph_sizes,
            async_scheduling=self.async_scheduling,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            max_num_partial_prefills=self.max_num_partial_prefills,
            max_long_partial_prefills=self.max_long_partial_prefills,
            prefill_attention_reference_len=self.prefill_attention_reference_len,
        )
        return VllmConfig(model_config=model_config, cache_config=cache_config,
                          scheduler_config=scheduler_config, parallel_config=parallel_config,
                          device_config=device_config)

    # ---- CLI ----------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, *, include_model: bool = True
                     ) -> argparse.ArgumentParser:
        """Add one --flag per field (vLLM's spelling: --max-model-len ...).

        Booleans that default to True also get --no-<flag>. `include_model=False` leaves
        --model out (for CLIs that take the model as a positional argument).
        """
        for f in dataclasses.fields(EngineArgs):
            if f.name == "model" and not include_model:
                continue
            flag = "--" + f.name.replace("_", "-")
            kwargs: dict[str, Any] = {"dest": f.name, "default": f.default,
                                      "help": _HELP.get(f.name)}
            if f.type == "bool":
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
            elif f.name == "cuda_graph_sizes":
                parser.add_argument(flag, type=int, nargs="+", **kwargs)
            else:
                parser.add_argument(flag, type=_CLI_TYPES.get(f.type, str), **kwargs)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """Build EngineArgs from a namespace parsed with add_cli_args (extra keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


_CLI_TYPES = {
    "int": int, "int | None": int, "float": float, "float | None": float,
    "str": str, "str | None": str,
}
