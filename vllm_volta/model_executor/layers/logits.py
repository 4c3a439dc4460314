"""Hidden states -> vocabulary logits."""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta.model_executor.layers.decode_gemv import gemv_enabled, linear
from vllm_volta.model_executor.layers.layernorm import RMSNorm
from vllm_volta.model_executor.layers.parallel_state import tensor_model_parallel_all_gather
from vllm_volta.model_executor.layers.vocab_parallel_embedding import ParallelLMHead


class LogitsProcessor(nn.Module):
    """``logits = (hidden @ lm_head.weight^T [+ bias]) * scale``, gathered over ranks and cut to
    ``vocab_size`` (dropping padding rows), in the model's dtype as in vLLM: the sampler reads
    them as they are and makes a float32 copy only for the stages that need one (a [B, V]
    float32 copy per step is a pass over a large tensor at big batches).

    ``soft_cap`` (Gemma 2's final_logit_softcapping): logits -> cap * tanh(logits / cap),
    computed in float32 and rounded back to the model's dtype."""

    def __init__(self, vocab_size: int, scale: float = 1.0, soft_cap: float | None = None) -> None:
        super().__init__()
        if soft_cap is not None and not soft_cap > 0:
            raise ValueError(f"soft_cap must be > 0 or None, got {soft_cap!r}")
        self.vocab_size = vocab_size
        self.scale = scale
        self.soft_cap = soft_cap
        # Decode rows through the gemv kernel, as the other projections: cuBLAS's kernel for
        # one row also clears a scratch buffer first (one more launch per step).
        self.use_gemv = gemv_enabled()

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor,
                norm: RMSNorm | None = None) -> torch.Tensor:
        """Logits of ``hidden_states``, or of ``norm(hidden_states)`` with a ``norm`` (at decode
        sizes the gemv kernel's prologue: no norm launch)."""
        logits = linear(hidden_states, lm_head.weight, lm_head.bias, self.use_gemv, norm)
        logits = tensor_model_parallel_all_gather(logits)[..., : self.vocab_size]
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.soft_cap is not None:
            logits = (torch.tanh(logits.float() / self.soft_cap) * self.soft_cap).to(logits.dtype)
        return logits
