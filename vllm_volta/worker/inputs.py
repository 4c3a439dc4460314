"""Flat model inputs for one step: token ids, positions, AttentionMetadata, logits rows.

Built with numpy (this runs every step, for up to max_num_seqs sequences) and moved to
the device in a handful of copies.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.core.scheduler import ScheduledRequest


@dataclass
class ModelInput:
    input_ids: torch.Tensor        # [T] int64, device
    positions: torch.Tensor        # [T] int64, device
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor   # [N] int64, device: rows of the hidden states to sample
    sample_rows: list[int]         # for each of the N rows, its index in the scheduled list
    query_start_loc: np.ndarray    # [B+1] host copy, for prompt-logprob slicing

    @property
    def num_tokens(self) -> int:
        return self.attn_metadata.num_actual_tokens


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def prepare_inputs(scheduled: Sequence[ScheduledRequest], block_size: int,
                   device: torch.device) -> ModelInput:
    """Lay the step's new tokens out back to back (the AttentionMetadata contract)."""
    num_seqs = len(scheduled)
    num_new = np.fromiter((s.num_new_tokens for s in scheduled), np.int64, num_seqs)
    num_computed = np.fromiter((s.num_computed_tokens for s in scheduled), np.int64, num_seqs)
    qsl = np.zeros(num_seqs + 1, np.int32)
    np.cumsum(num_new, out=qsl[1:])
    num_tokens = int(qsl[-1])
    seq_lens = (num_computed + num_new).astype(np.int32)

    token_ids: list[int] = []
    for s in scheduled:
        token_ids += s.token_ids
    # Position of flat token t of sequence i: t - qsl[i] + num_computed[i].
    positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(qsl[:-1] - num_computed, num_new)

    max_blocks = max((len(s.block_ids) for s in scheduled), default=1)
    block_table = np.zeros((num_seqs, max(max_blocks, 1)), np.int32)
    for i, s in enumerate(scheduled):
        block_table[i, :len(s.block_ids)] = s.block_ids
    seq_of_token = np.repeat(np.arange(num_seqs), num_new)
    slot_mapping = (block_table[seq_of_token, positions // block_size].astype(np.int64)
                    * block_size + positions % block_size)

    sample_rows = [i for i, s in enumerate(scheduled) if s.samples]
    logits_indices = (qsl[1:][sample_rows] - 1).astype(np.int64)

    qsl_t, seq_lens_t = torch.from_numpy(qsl), torch.from_numpy(seq_lens)
    attn_metadata = AttentionMetadata(
        num_actual_tokens=num_tokens,
        query_start_loc=_to_device(qsl, device),
        seq_lens=_to_device(seq_lens, device),
        block_table=_to_device(block_table, device),
        slot_mapping=_to_device(slot_mapping, device),
        max_query_len=int(num_new.max()) if num_seqs else 0,
        max_seq_len=int(seq_lens.max()) if num_seqs else 0,
        query_start_loc_cpu=qsl_t,
        seq_lens_cpu=seq_lens_t,
    )
    return ModelInput(
        input_ids=_to_device(np.asarray(token_ids, np.int64), device),
        positions=_to_device(positions, device),
        attn_metadata=attn_metadata,
        logits_indices=_to_device(logits_indices, device),
        sample_rows=sample_rows,
        query_start_loc=qsl,
    )
