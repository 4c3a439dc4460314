"""Mixture-of-experts MLP (Mixtral, Qwen2/3-MoE).

Each token's router logits (``gate``, a replicated linear layer) go through a float32 softmax;
its ``top_k`` experts are the largest probabilities (renormalized to sum to 1 when
``renormalize``), and its output is the probability-weighted sum of those experts' gated MLPs,
down(act(gate(x)) * up(x)). The experts' weights are stacked: ``w13`` [E, 2I, H] (gate rows,
then up rows) and ``w2`` [E, H, I]; with tensor parallelism each rank holds a slice of every
expert's intermediate size and the partial outputs are summed across ranks. With expert
parallelism (expert_parallel.py) each rank instead holds whole experts, ``w13`` [E_local, 2I, H],
and ``expert_map`` turns the globally routed ids into local ones (-1: another rank's expert,
which contributes nothing here); the same all-reduce sums the ranks' shares. Subclasses add
TP-sharded extras (a shared expert) to this rank's share before that one all-reduce
(``forward_local``).

On a GPU with the mixture-of-experts kernels (SiLU or GELU-tanh experts, float16 / float32,
bfloat16 on SM80+)
the routing (``topk_softmax``) and the experts (fused_moe.py: decode GEMVs over the chosen
experts' rows, or a tensor-core grouped GEMM over expert-sorted tokens) run on the device with
no host sync and shapes fixed by the token count, so MoE models run in CUDA graphs. Elsewhere
(CPU, exact GELU) the tokens are grouped by expert on the host (a device-to-host copy of
the routing each layer) and each used expert runs two GEMMs on its tokens.

Under a quantization config (quantization/moe_quant.py: 4-bit AWQ / GPTQ / compressed-tensors,
FP8) the experts keep their packed tensors; float16 models on a GPU run them through
fused_moe_quant.py (4-bit GEMVs, or dequantized experts + the float16 kernels), elsewhere the
host-grouped loop dequantizes each used expert per call. The router stays float.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta.logger import info_once, init_logger
from vllm_volta.model_executor.layers import fused_moe, fused_moe_quant
from vllm_volta.model_executor.layers.activation import get_act_and_mul_fn
from vllm_volta.model_executor.layers.expert_parallel import moe_placement
from vllm_volta.model_executor.layers.linear import ReplicatedLinear, copy_weight, take_shard
from vllm_volta.model_executor.layers.parallel_state import (
    divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce)
from vllm_volta.model_executor.layers.moe_routing import select_experts
from vllm_volta.model_executor.layers.quantization import current_quant_config, quantization
from vllm_volta.model_executor.layers.quantization.moe_quant import make_moe_quant_method

logger = init_logger(__name__)


class MoE(nn.Module):
    """x [T, H] -> [T, H]; checkpoint experts load through ``load_expert``."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, hidden_act: str = "silu") -> None:
        super().__init__()
        self.quant_method = make_moe_quant_method(current_quant_config())  # None: dense experts
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.placement = moe_placement(num_experts)  # None: a slice of every expert (TP)
        if self.placement is None:
            self.intermediate = divide(intermediate_size, self.tp_size, "moe intermediate size")
            self.expert_map: torch.Tensor | None = None
            local_experts = num_experts
        else:  # whole experts: the weights are not split within an expert
            self.intermediate = intermediate_size
            self.register_buffer("expert_map", self.placement.expert_map(), persistent=False)
            local_experts = self.placement.num_local
        self.num_local_experts = local_experts
        with quantization(None):  # routers stay dense in quantized checkpoints
            self.gate = ReplicatedLinear(hidden_size, num_experts)
        dtype = torch.get_default_dtype()
        self.act_dtype = dtype  # the model's activations (quantized experts' GPU path needs float16)
        if self.quant_method is not None:
            self.quant_method.create_weights(self, local_experts, hidden_size, self.intermediate)
            info_once(logger, "MoE experts: %s", self.quant_method.describe())
        else:
            self._dense_experts(local_experts, hidden_size, dtype)
        self.hidden_act = hidden_act
        self.act_fn = get_act_and_mul_fn(hidden_act)
        self._kernel_device: str | None = None  # the device name tuned configs are looked up for
        self._device_path: tuple = (None, None)  # (weights' device and dtype, device_path_reason)

    def _dense_experts(self, local_experts: int, hidden_size: int, dtype: torch.dtype) -> None:
        self.w13 = nn.Parameter(torch.empty(local_experts, 2 * self.intermediate, hidden_size, dtype=dtype),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(local_experts, hidden_size, self.intermediate, dtype=dtype),
                               requires_grad=False)

    def expert_param_names(self) -> tuple[str, ...]:
        """This layer's stacked expert parameters (checkpoint experts load into them)."""
        return ("w13", "w2") if self.quant_method is None else self.quant_method.param_names()

    def expert_tensors_per_part(self) -> int:
        """How many checkpoint tensors each expert projection must supply."""
        return 1 if self.quant_method is None else len(self.quant_method.required)

    def is_required_expert_tensor(self, suffix: str) -> bool:
        """Whether a checkpoint expert tensor of this suffix is one every projection must supply."""
        if self.quant_method is None:
            return suffix == "weight"
        return self.quant_method.role(suffix) in self.quant_method.required

    def load_expert(self, expert: int, part: str, loaded: torch.Tensor, suffix: str = "weight") -> None:
        """One expert's checkpoint tensor: ``part`` "gate" / "up" ([I, H]) or "down" ([H, I]);
        ``suffix`` names quantized tensors (qweight, scales, ...: the quant method's).
        With expert parallelism another rank's expert is skipped (never copied here)."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert index {expert} is outside [0, {self.num_experts})")
        if part not in ("gate", "up", "down"):
            raise ValueError(f"expert weight part must be one of gate, up, down, got {part!r}")
        n, rank, shards = self.intermediate, self.tp_rank, self.tp_size
        if self.placement is not None:
            local = self.placement.local_index(expert)
            if local is None:
                return
            expert, rank, shards = local, 0, 1
        if self.quant_method is not None:
            self.quant_method.load(self, expert, part, suffix, loaded, rank, shards)
            return
        if suffix != "weight":
            raise ValueError(f"expert tensor {suffix!r} in a checkpoint without a quantization_config")
        if part == "down":
            copy_weight(self.w2.data[expert], take_shard(loaded, 1, rank, n, n * shards))
            return
        offset = {"gate": 0, "up": n}[part]
        copy_weight(self.w13.data[expert, offset:offset + n], take_shard(loaded, 0, rank, n, n * shards))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids int32 [T, k], their weights float32 [T, k]), computed on x's device."""
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        return ids, weights

    def device_path_reason(self) -> str | None:
        """Why the experts cannot run on the device path (fused_moe.py), or None if they can
        (decided once per weight device and dtype: forward asks every call)."""
        if self.quant_method is not None:
            return fused_moe_quant.unsupported_reason(self)
        key = (self.w13.device, self.w13.dtype, self.w13.is_contiguous(), self.w2.is_contiguous())
        if self._device_path[0] != key:
            self._device_path = (key, fused_moe.unsupported_reason(self.w13, self.w2, self.top_k,
                                                                   self.hidden_act))
        return self._device_path[1]

    def kernel_config_shape(self, dtype: torch.dtype) -> dict:
        """The shape keys of this layer's ``fused_moe`` kernel config file (kernel_configs.py)."""
        return dict(num_experts=self.w13.shape[0], top_k=self.top_k, hidden_size=self.w13.shape[2],
                    intermediate_size=self.intermediate, dtype=dtype)

    def _kernel_config(self, tokens: int, dtype: torch.dtype) -> dict:
        """The tuned launch parameters for this token count (fused_moe.py), else the defaults."""
        from vllm_volta.kernel_configs import get_kernel_config
        if self._kernel_device is None:
            self._kernel_device = torch.cuda.get_device_name(self.w13.device)
        default = fused_moe.default_config(tokens, self.num_experts, self.top_k, dtype)
        config = get_kernel_config("fused_moe", tokens, default=default, device_name=self._kernel_device,
                                   **self.kernel_config_shape(dtype))
        return fused_moe.check_config(config, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.forward_local(x)
        return tensor_model_parallel_all_reduce(out) if self.tp_size > 1 else out

    def forward_local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the all-reduce over the ranks: its slice of
        every chosen expert (TP), or its own chosen experts in whole (EP). Subclasses add their
        TP-sharded extras here, so one all-reduce sums everything."""
        ids, weights = self.route(x)
        if self.quant_method is not None and x.is_cuda and self.device_path_reason() is None:
            return fused_moe_quant.quantized_experts(self, x, ids, weights)
        if self.quant_method is None and x.is_cuda and self.device_path_reason() is None:
            tokens = max(x.shape[0], 1)
            config = self._kernel_config(tokens, x.dtype)
            if torch.cuda.is_current_stream_capturing():  # no host path inside a graph
                config = fused_moe.capturable_config(config, tokens, self.num_experts, self.top_k, x.dtype)
            if self.expert_map is not None:
                config = fused_moe.expert_parallel_config(config, x.dtype)
            if config["path"] != "host":
                dtype = str(x.dtype).removeprefix("torch.")
                if self.expert_map is None:
                    info_once(logger, "MoE experts on the device (%s, %s): decode GEMVs or a grouped GEMM by "
                              "token count (fused_moe kernel configs, else GEMVs up to %d tokens)",
                              dtype, self.hidden_act, fused_moe.DECODE_MAX_TOKENS)
                else:
                    info_once(logger, "MoE experts on the device with expert parallelism (%s, %s): the grouped "
                              "GEMM over this rank's experts' pairs at every batch size (float32: GEMVs)",
                              dtype, self.hidden_act)
                return fused_moe.fused_experts(x, self.w13, self.w2, weights, ids, config,
                                               fused_moe.ACTIVATIONS[self.hidden_act], self.expert_map)
        if self.quant_method is not None:
            info_once(logger, "MoE %s experts: the chosen experts dequantized in PyTorch each call, host-grouped "
                      "(%s)", self.quant_method.kind, self.device_path_reason() if x.is_cuda else x.device.type)
        if self.expert_map is not None:
            ids = fused_moe.local_ids(ids, self.expert_map)
        return self._forward_host_grouped(x, ids, weights.to(x.dtype))

    def _forward_host_grouped(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Tokens grouped by expert on the host; two GEMMs per used expert. ``ids`` index
        ``w13``; -1 (another rank's expert) is skipped."""
        out = torch.zeros_like(x)
        flat = ids.flatten().long() + 1  # bucket 0: the pairs of other ranks' experts
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=self.num_local_experts + 1).tolist()  # the one host sync
        tokens = order // self.top_k
        pair_weights = weights.flatten()[order]  # in expert order, as tokens
        start = counts[0]
        for expert, count in enumerate(counts[1:]):
            if count == 0:
                continue
            rows = tokens[start:start + count]
            w = pair_weights[start:start + count]
            w13, w2 = self.expert_weights(expert, x.dtype)
            h = self.act_fn(x[rows] @ w13.t()) @ w2.t()
            out.index_add_(0, rows, h * w[:, None])
            start += count
        return out

    def expert_weights(self, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2I, H], w2 [H, I]) of local ``expert``; quantized experts dequantized to ``dtype``."""
        if self.quant_method is None:
            return self.w13[expert], self.w2[expert]
        return self.quant_method.expert_weights(self, expert, dtype)


def supports_cuda_graphs(model: nn.Module) -> bool:
    """Whether every MoE layer of ``model`` runs on the device path (no host sync), so its steps
    can be captured in CUDA graphs."""
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    return bool(moes) and all(m.device_path_reason() is None for m in moes)
