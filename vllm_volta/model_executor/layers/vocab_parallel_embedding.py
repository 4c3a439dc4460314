"""Token embedding and LM head with the vocabulary split across tensor-parallel ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_volta.model_executor.layers.linear import copy_weight
from vllm_volta.model_executor.layers.parallel_state import (
    get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce)


# ATen's index_select (what F.embedding runs) gathers 2 to 16 ids with a kernel that walks them
# one after another: on an H200, 2.1 us for 2 rows up to 7.5 us for 16 (13 us in a Qwen2.5-1.5B
# decode step of 16 rows), against 1.4 us for indexing at each of these sizes. From 17 ids on
# the two take the same time; for one id index_select is faster (1.8 vs 2.8 us).
_INDEXED_LOOKUP_IDS = range(2, 17)


def embedding_lookup(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.embedding(ids, weight)`` for ids within the table (the engine validates prompt ids),
    by indexing where that is faster."""
    if ids.dim() == 1 and ids.shape[0] in _INDEXED_LOOKUP_IDS:
        return weight[ids]
    return F.embedding(ids, weight)


class VocabParallelEmbedding(nn.Module):
    """Embedding table; rank r holds rows [r*n, (r+1)*n) with n = ceil(vocab / tp_size)
    (rows past the vocabulary are zero padding)."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 params_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(f"num_embeddings and embedding_dim must be >= 1, got "
                             f"{num_embeddings}, {embedding_dim}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = min(self.vocab_start_index + self.num_embeddings_per_partition,
                                   num_embeddings)
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim,
                        dtype=params_dtype or torch.get_default_dtype()), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if loaded_weight.shape[0] != self.num_embeddings:
            raise ValueError(f"checkpoint vocabulary has {loaded_weight.shape[0]} rows, "
                             f"the config says vocab_size={self.num_embeddings}")
        rows = self.vocab_end_index - self.vocab_start_index
        param.data[rows:].zero_()
        copy_weight(param.data[:rows], loaded_weight[self.vocab_start_index:self.vocab_end_index])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return embedding_lookup(input_ids, self.weight)
        # Each rank embeds the ids it owns (others -> 0), then the ranks sum.
        mine = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = torch.where(mine, input_ids - self.vocab_start_index, 0)
        out = embedding_lookup(local_ids, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return tensor_model_parallel_all_reduce(out)

    def extra_repr(self) -> str:
        return (f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
                f"tp_size={self.tp_size}")


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection to the vocabulary; its weight is used by LogitsProcessor, not forward."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False,
                 params_dtype: torch.dtype | None = None) -> None:
        super().__init__(num_embeddings, embedding_dim, params_dtype)
        if bias:
            self.bias = nn.Parameter(
                torch.empty(self.num_embeddings_per_partition, dtype=self.weight.dtype),
                requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        """Share the input embedding's weight (tie_word_embeddings)."""
        self.weight = embed_tokens.weight
        return self

    def forward(self, *args: object) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly")
