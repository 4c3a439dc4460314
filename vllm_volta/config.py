"""Engine configuration: what model, how much KV cache, how to schedule.

The dataclasses validate their own fields (ValueError naming the field and the
allowed range) and resolve everything that depends on the model or the hardware
(dtype, max_model_len, device) once, so the rest of the engine reads plain values.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_volta.logger import info_once, init_logger

logger = init_logger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
# vLLM's --quantization values we run, and the checkpoint format each one means (the Marlin
# variants name kernels Volta does not have: the same checkpoints run on ours).
_QUANTIZATION_ALIASES = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq", "gguf": "gguf",
                         "compressed-tensors": "compressed-tensors"}
# Model types whose activations exceed float16's range (trained in bfloat16; vLLM keeps them off
# float16 too): "auto" never picks float16 for them.
_FLOAT16_OVERFLOWS = ("gemma2", "gemma3", "gemma3_text")
# Model types that run float16 with their residual stream in float32 (models/gemma4.py), so "auto"
# keeps float16 where bfloat16 is missing (Gemma 4 31B / 26B in float32 do not fit V100s).
_FLOAT16_FP32_RESIDUAL = ("gemma4", "gemma4_text")
# vLLM's names: full graphs for pure-decode steps and piecewise graphs (around the attention
# layers) for the other steps, or the decode graphs alone. enforce_eager turns both off.
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")

# HF config keys that bound the context length, in vLLM's order of preference.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# Rope types whose factor does NOT extend max_position_embeddings (already baked in).
_ROPE_TYPES_NO_EXTEND = ("default", "llama3", "longrope", "su", "mrope")


def _require(cond: bool, field_name: str, allowed: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{field_name} must be {allowed}, got {value!r}")


def _config_dtype(hf_config: Any) -> torch.dtype:
    """The checkpoint's dtype as stored in the HF config (float32 when absent)."""
    # The instance dict, not getattr: transformers 5 warns on every read of `torch_dtype`
    # (its old name, still the attribute in transformers 4).
    fields = vars(hf_config)
    raw = fields.get("dtype") or fields.get("torch_dtype")
    if isinstance(raw, torch.dtype):
        return raw
    if isinstance(raw, str) and isinstance(getattr(torch, raw, None), torch.dtype):
        return getattr(torch, raw)
    return torch.float32


def derive_max_model_len(hf_config: Any) -> int:
    """The longest context the checkpoint supports (vLLM's rule, simplified)."""
    text_config = getattr(hf_config, "text_config", None) or hf_config
    lens = [getattr(text_config, k) for k in _MAX_LEN_KEYS
            if isinstance(getattr(text_config, k, None), int)]
    if not lens:
        logger.warning("The model config names no maximum length; assuming 2048.")
        return 2048
    max_len = min(lens)
    rope = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None)
    if isinstance(rope, dict):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        factor = rope.get("factor")
        if rope_type not in _ROPE_TYPES_NO_EXTEND and factor:
            if rope_type == "yarn":
                max_len = rope.get("original_max_position_embeddings", max_len)
            max_len = int(max_len * factor)
    return max_len


@dataclass
class ModelConfig:
    """The model to serve. `model=None` means the default model (DESIGN section 5).

    After construction: `dtype` is a torch.dtype chosen by the platform, `hf_config`
    is the transformers config, `model_path` the resolved local file or folder, and
    `max_model_len` is set and within what the model supports.
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str | torch.dtype = "auto"
    seed: int = 0
    max_model_len: int | None = None
    load_format: str = "auto"
    # vLLM's --quantization: checked against the checkpoint's quantization_config (which decides).
    quantization: str | None = None
    revision: str | None = None
    tokenizer_revision: str | None = None
    served_model_name: str | None = None
    trust_remote_code: bool = False
    enforce_eager: bool = False
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    cudagraph_metrics: bool = False  # log how steps ran (worker/cudagraph_metrics.py)
    # Decode steps whose longest context exceeds this run eagerly (graphs bake the bound in).
    max_seq_len_to_capture: int = 8192
    max_logprobs: int = 20
    skip_tokenizer_init: bool = False
    # Sampling defaults: "auto" = the model's generation_config.json (vLLM's default), "vllm" =
    # vLLM's own, or a folder holding a generation_config.json.
    generation_config: str = "auto"
    # Given directly (tests) or resolved from `model` in __post_init__.
    hf_config: Any = None
    model_path: str | None = None

    def __post_init__(self) -> None:
        _require(self.load_format in LOAD_FORMATS, "load_format", f"one of {LOAD_FORMATS}",
                 self.load_format)
        _require(isinstance(self.cudagraph_mode, str) and self.cudagraph_mode.upper() in CUDAGRAPH_MODES,
                 "cudagraph_mode", f"one of {CUDAGRAPH_MODES}", self.cudagraph_mode)
        self.cudagraph_mode = self.cudagraph_mode.upper()
        _require(isinstance(self.max_logprobs, int) and self.max_logprobs >= 0, "max_logprobs",
                 ">= 0", self.max_logprobs)
        _require(isinstance(self.max_seq_len_to_capture, int) and self.max_seq_len_to_capture >= 1,
                 "max_seq_len_to_capture", ">= 1", self.max_seq_len_to_capture)
        _require(self.generation_config in ("auto", "vllm") or Path(self.generation_config).is_dir(),
                 "generation_config", "'auto', 'vllm' or a folder with a generation_config.json",
                 self.generation_config)
        if self.model is None:
            from vllm_volta.transformers_utils.default_model import (
                DEFAULT_MODEL_NAME, get_default_model_path)
            self.model = str(get_default_model_path())
            self.served_model_name = self.served_model_name or DEFAULT_MODEL_NAME
        self.model = str(self.model)
        if self.hf_config is None:
            self._resolve_source()
        if self.model_path is None:
            self.model_path = self.model
        if self.served_model_name is None:
            self.served_model_name = self.model
        self.dtype = self._resolve_dtype(self.dtype)
        self.max_model_len = self._verify_max_model_len(self.max_model_len)
        self._verify_quantization()

    def _verify_quantization(self) -> None:
        from vllm_volta.model_executor.layers.quantization import get_quant_config

        found = get_quant_config(self.hf_config)  # ValueError for a method we cannot run
        if self.quantization is None:
            return
        aliases = {**_QUANTIZATION_ALIASES, "fp8": "fp8"}  # FP8 checkpoints (layers/quantization/fp8.py)
        asked = aliases.get(str(self.quantization).lower())
        _require(asked is not None, "quantization", f"one of {sorted(aliases)}", self.quantization)
        if self.load_format == "gguf" or str(self.model_path).endswith(".gguf"):
            have = "gguf"
        else:
            have = None if found is None else found.quant_method
        if asked != have:
            raise ValueError(f"quantization={self.quantization!r}, but the checkpoint is "
                             f"{'not quantized' if have is None else have + '-quantized'} "
                             f"(its config.json's quantization_config)")

    def _resolve_source(self) -> None:
        from vllm_volta.transformers_utils.config import resolve_model_source
        source = resolve_model_source(self.model, revision=self.revision,
                                      trust_remote_code=self.trust_remote_code,
                                      require_weights=self.load_format != "dummy")
        self.hf_config = source.hf_config
        self.model_path = str(source.path)

    def _resolve_dtype(self, requested: str | torch.dtype) -> torch.dtype:
        from vllm_volta.platforms import current_platform
        dtype = current_platform.resolve_dtype(requested, _config_dtype(self.hf_config))
        model_type = getattr(self.hf_config, "model_type", None)
        if dtype == torch.float16 and model_type in _FLOAT16_FP32_RESIDUAL:
            logger.info("%s in float16: the residual stream stays float32 (it outgrows float16)", model_type)
            return dtype
        if dtype != torch.float16 or model_type not in _FLOAT16_OVERFLOWS:
            return dtype
        if isinstance(requested, str) and requested.lower() == "auto":
            # As vLLM: the next dtype the device has (bfloat16 was not: float32).
            logger.warning("%s activations overflow float16 (outputs turn to NaN) and this device has no "
                           "bfloat16: running float32. --dtype half runs float16 anyway.", model_type)
            return torch.float32
        logger.warning("%s in float16: its activations can overflow (outputs turn to NaN); bfloat16 or "
                       "float32 are safe", model_type)
        return dtype

    def _verify_max_model_len(self, requested: int | None) -> int:
        supported = derive_max_model_len(self.hf_config)
        if requested is None:
            return supported
        _require(isinstance(requested, int) and requested >= 1, "max_model_len",
                 f"an integer in [1, {supported}]", requested)
        if requested > supported:
            raise ValueError(
                f"max_model_len={requested} is larger than the model supports "
                f"({supported}, from its config); allowed range is [1, {supported}]")
        return requested

    @property
    def text_config(self) -> Any:
        return getattr(self.hf_config, "text_config", None) or self.hf_config

    def get_num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    def get_num_attention_heads(self) -> int:
        return self.text_config.num_attention_heads

    def _per_layer(self, name: str) -> list[Any] | None:
        """A setting that varies by layer (Gemma 4's ``per_layer_config``, where a global read of
        it raises), one value per layer; None for models whose layers are alike."""
        layers = getattr(self.text_config, "per_layer_config", None)  # any config in recent transformers
        values = [getattr(layer, name, None) for layer in layers] if layers else []
        return values if values and all(v is not None for v in values) else None

    def get_num_kv_heads(self) -> int:
        """KV heads (the largest count of any layer where they vary)."""
        per_layer = self._per_layer("num_key_value_heads")
        if per_layer:
            return max(per_layer)
        kv = getattr(self.text_config, "num_key_value_heads", None)
        return kv or self.get_num_attention_heads()

    def get_head_size(self) -> int:
        """The head size (the largest of any layer where they vary: the attention backend must
        run it)."""
        per_layer = self._per_layer("head_dim")
        if per_layer:
            return max(per_layer)
        head_dim = getattr(self.text_config, "head_dim", None)
        if head_dim:
            return head_dim
        return self.text_config.hidden_size // self.get_num_attention_heads()

    @property
    def has_recurrent_state(self) -> bool:
        """Whether some layers keep a recurrent state per request instead of a KV cache
        (linear attention: Qwen3.5, Qwen3-Next)."""
        return "linear_attention" in (getattr(self.text_config, "layer_types", None) or ())

    def get_vocab_size(self) -> int:
        return self.text_config.vocab_size

    @property
    def architectures(self) -> list[str]:
        return list(getattr(self.hf_config, "architectures", None) or [])

    @property
    def tokenizer_source(self) -> str:
        return self.tokenizer or self.model_path or self.model

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """The sampling defaults the model's creator recommends (generation_config.json:
        temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens as max_tokens)
        under generation_config="auto" or a folder; {} under "vllm" or without the file. Reads
        the file on each call: callers keep the result."""
        if self.generation_config == "vllm":
            return {}
        folder = self.model_path if self.generation_config == "auto" else self.generation_config
        path = Path(folder or "") / "generation_config.json"
        if not path.is_file():
            return {}
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"generation_config: {path} is not readable JSON ({exc})") from exc
        names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
        defaults = {ours: values[theirs] for theirs, ours in names.items()
                    if values.get(theirs) is not None}
        if defaults:  # as vLLM says when the model's recommendations replace its own
            info_once(logger, "Sampling defaults from %s: %s (fields a request sets win; "
                      "--generation-config vllm turns this off)", path, defaults)
        return defaults


@dataclass
class CacheConfig:
    """Paged KV cache. `num_gpu_blocks` is filled in by the engine after sizing."""

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    cpu_kvcache_space: float | None = None  # GiB; None -> VLLM_VOLTA_CPU_KVCACHE_SPACE
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    num_gpu_blocks: int | None = None
    # The cache's element type: "auto" (the model dtype), "fp8" / "fp8_e4m3" or "fp8_e5m2"
    # (attention/kv_cache_dtype.py).
    kv_cache_dtype: str = "auto"
    # Recurrent-state slots (hybrid models: max_num_seqs + 1, slot 0 scratch; 0 otherwise),
    # set by VllmConfig.
    num_state_slots: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.block_size, int) and 1 <= self.block_size <= 256, "block_size",
                 "an integer in [1, 256]", self.block_size)
        _require(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
                 "in (0, 1]", self.gpu_memory_utilization)
        if self.cpu_kvcache_space is not None:
            _require(self.cpu_kvcache_space > 0, "cpu_kvcache_space", "> 0 (GiB)",
                     self.cpu_kvcache_space)
        from vllm_volta.attention.kv_cache_dtype import check_kv_cache_dtype
        check_kv_cache_dtype(self.kv_cache_dtype)
        if self.num_gpu_blocks_override is not None:
            _require(isinstance(self.num_gpu_blocks_override, int)
                     and self.num_gpu_blocks_override >= 2,
                     "num_gpu_blocks_override", "an integer >= 2", self.num_gpu_blocks_override)

    def cpu_kvcache_bytes(self) -> int:
        space = self.cpu_kvcache_space
        if space is None:
            from vllm_volta import envs
            space = envs.VLLM_VOLTA_CPU_KVCACHE_SPACE
        return int(float(space) * (1 << 30))


@dataclass
class SchedulerConfig:
    """Continuous batching limits. Defaults depend on the device (see EngineArgs)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    # Decode batch sizes captured as CUDA graphs; None -> the default list.
    cuda_graph_sizes: list[int] | None = None
    # Schedule step n+1 while step n runs on the device (its sampled tokens are fed to
    # step n+1 on the device); the host's work overlaps the GPU's.
    async_scheduling: bool = False
    # Chunked-prefill policy (core/chunk_policy.py). vLLM's knobs: a prompt with more than
    # long_prefill_token_threshold tokens left gets at most that many a step (0: no limit; 4% of
    # max_model_len when max_num_partial_prefills > 1); at most max_num_partial_prefills requests
    # end a step partially prefilled, max_long_partial_prefills of them long.
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    # Beside running decodes, a chunk's attention work (tokens x (context + tokens / 2)) stays
    # within max_num_batched_tokens x this many keys; 0 disables the cap.
    prefill_attention_reference_len: int = 1024
    # The model's KV-cache groups (core/kv_cache_groups.KVCacheLayout), set when the cache is
    # sized (Worker.initialize_cache, or the executor from its rank 0); None: one block table.
    kv_cache_layout: Any = None

    def __post_init__(self) -> None:
        _require(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1, "max_num_seqs",
                 ">= 1", self.max_num_seqs)
        _require(isinstance(self.max_num_batched_tokens, int) and self.max_num_batched_tokens >= 1,
                 "max_num_batched_tokens", ">= 1", self.max_num_batched_tokens)
        if not self.enable_chunked_prefill:
            # Without chunking a whole prompt must fit one step.
            _require(self.max_num_batched_tokens >= self.max_model_len, "max_num_batched_tokens",
                     f">= max_model_len ({self.max_model_len}) when chunked prefill is disabled",
                     self.max_num_batched_tokens)
        if self.cuda_graph_sizes is not None:
            _require(all(isinstance(s, int) and s >= 1 for s in self.cuda_graph_sizes),
                     "cuda_graph_sizes", "a list of integers >= 1", self.cuda_graph_sizes)
        self._check_chunk_policy()

    def _check_chunk_policy(self) -> None:
        for name, low in (("long_prefill_token_threshold", 0), ("max_num_partial_prefills", 1),
                          ("max_long_partial_prefills", 1), ("prefill_attention_reference_len", 0)):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= low, name,
                     f"an integer >= {low}", value)
        _require(self.long_prefill_token_threshold <= self.max_model_len, "long_prefill_token_threshold",
                 f"<= max_model_len ({self.max_model_len})", self.long_prefill_token_threshold)
        _require(self.max_long_partial_prefills <= self.max_num_partial_prefills, "max_long_partial_prefills",
                 f"<= max_num_partial_prefills ({self.max_num_partial_prefills})", self.max_long_partial_prefills)
        if self.max_num_partial_prefills > 1:
            _require(self.enable_chunked_prefill, "max_num_partial_prefills",
                     "1 when chunked prefill is disabled", self.max_num_partial_prefills)
            if self.long_prefill_token_threshold == 0:
                self.long_prefill_token_threshold = max(1, int(self.max_model_len * 0.04))


@dataclass
class ParallelConfig:
    """Tensor and pipeline parallelism: one worker process per device, tensor_parallel_size x
    pipeline_parallel_size of them (each pipeline stage holds a slice of the layers:
    model_executor/layers/pp_partition.py, VLLM_PP_LAYER_PARTITION)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # How ranks are started: "mp" (processes on this node), "ray" (Ray actors, any node of a
    # Ray cluster), "uni" (this process: one rank only).
    distributed_executor_backend: str = "mp"
    # MoE layers hold whole experts, num_experts / tensor_parallel_size per rank, instead of a
    # slice of every expert (vLLM's --enable-expert-parallel; EP size = TP size here).
    enable_expert_parallel: bool = False

    def __post_init__(self) -> None:
        _require(isinstance(self.enable_expert_parallel, bool), "enable_expert_parallel", "True or False",
                 self.enable_expert_parallel)
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                     name, "an integer >= 1", value)
        backend = self.distributed_executor_backend
        _require(backend in ("mp", "ray", "uni"), "distributed_executor_backend",
                 "one of mp, ray, uni", backend)
        if backend == "uni" and self.world_size > 1:
            raise ValueError(f"distributed_executor_backend='uni' runs one rank; "
                             f"tensor_parallel_size={self.tensor_parallel_size} x pipeline_parallel_size="
                             f"{self.pipeline_parallel_size} needs 'mp' or 'ray'")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class DeviceConfig:
    """Which torch device the model runs on ("auto" asks the platform)."""

    device: str = "auto"

    def __post_init__(self) -> None:
        _require(self.device in ("auto", "cuda", "cpu"), "device", "one of auto, cuda, cpu",
                 self.device)
        if self.device == "auto":
            from vllm_volta.platforms import current_platform
            self.device = current_platform.device_type
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but no CUDA GPU is available")


@dataclass
class VllmConfig:
    """Everything the engine needs, in one object."""

    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        from vllm_volta.platforms import current_platform
        current_platform.check_and_update_config(self)
        self._configure_recurrent_state()
        tp = self.parallel_config.tensor_parallel_size
        heads = self.model_config.get_num_attention_heads()
        if heads % tp:  # a property of the model: reported first, on any machine
            raise ValueError(f"tensor_parallel_size={tp} must divide the model's "
                             f"{heads} attention heads")
        self._check_pipeline_parallel()
        world = self.parallel_config.world_size
        if (self.device_config.device == "cuda" and world > torch.cuda.device_count()
                and self.parallel_config.distributed_executor_backend != "ray"):  # other nodes
            raise ValueError(f"tensor_parallel_size={tp} x pipeline_parallel_size="
                             f"{self.parallel_config.pipeline_parallel_size} needs {world} GPUs, but "
                             f"{torch.cuda.device_count()} are visible; allowed range of their product "
                             f"is [1, {torch.cuda.device_count()}]")

    def _check_pipeline_parallel(self) -> None:
        """Pipeline stages need a layer each (and VLLM_PP_LAYER_PARTITION, when set, must fit the
        model); their micro-batches in flight replace async scheduling."""
        pp = self.parallel_config.pipeline_parallel_size
        if pp == 1:
            return
        from vllm_volta.model_executor.layers.pp_partition import stage_layer_counts
        stage_layer_counts(self.model_config.get_num_layers(), pp)
        if self.scheduler_config.async_scheduling:
            raise ValueError(f"async_scheduling cannot be combined with pipeline_parallel_size={pp} "
                             f"(the pipeline keeps {pp} micro-batches in flight instead); turn it off")

    def _configure_recurrent_state(self) -> None:
        """Hybrid models keep one recurrent state per running request: a slot each (plus the
        scratch slot 0), and no prefix caching (a cached prefix would need the state at the
        block boundary, which is not kept)."""
        cc = self.cache_config
        if not self.model_config.has_recurrent_state:
            cc.num_state_slots = 0
            return
        cc.num_state_slots = self.scheduler_config.max_num_seqs + 1
        if cc.enable_prefix_caching:
            logger.info("Prefix caching off: %s keeps a recurrent state per request (linear "
                        "attention), which a cached prefix cannot restore",
                        self.model_config.architectures[0] if self.model_config.architectures
                        else "the model")
            cc.enable_prefix_caching = False
