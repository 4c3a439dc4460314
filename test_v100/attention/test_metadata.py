"""AttentionMetadata builder: fields computed by hand for a small batch."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.attention.metadata import build_attn_metadata, compute_positions


def test_fields_for_mixed_batch():
    # seq 0: decode at position 5; seq 1: fresh 3-token prefill; seq 2: chunk at positions 4..7.
    md = build_attn_metadata([5, 0, 4], [1, 3, 4], [[7, 2], [4], [0, 9, 3]], block_size=4)
    assert md.num_actual_tokens == 8 and md.num_seqs == 3
    assert md.query_start_loc.tolist() == [0, 1, 4, 8]
    assert md.seq_lens.tolist() == [6, 3, 8]
    assert md.block_table.tolist() == [[7, 2, 0], [4, 0, 0], [0, 9, 3]]
    # position 5 of seq 0 -> block 2, offset 1; seq 1 -> block 4 offsets 0..2;
    # seq 2 positions 4..7 -> its second block (9), offsets 0..3.
    assert md.slot_mapping.tolist() == [9, 16, 17, 18, 36, 37, 38, 39]
    assert md.max_query_len == 4 and md.max_seq_len == 8
    assert md.query_lens_cpu.tolist() == [1, 3, 4]
    assert md.query_start_loc.dtype == torch.int32 and md.seq_lens.dtype == torch.int32
    assert md.block_table.dtype == torch.int32 and md.slot_mapping.dtype == torch.int64
    assert md.query_start_loc_cpu.device.type == "cpu"


def test_positions():
    assert compute_positions([5, 0, 4], [1, 3, 4]).tolist() == [5, 0, 1, 2, 4, 5, 6, 7]
    assert compute_positions([2, 3], [0, 2]).tolist() == [3, 4]


@pytest.mark.parametrize("args,match", [
    (([0], [5], [[1]], 4), "blocks"),
    (([0, 1], [1], [[1]], 4), "one entry per sequence"),
    (([0], [-1], [[1]], 4), ">= 0"),
    (([0], [1], [[1]], 0), "block_size"),
])
def test_invalid_input(args, match):
    with pytest.raises(ValueError, match=match):
        build_attn_metadata(*args)
