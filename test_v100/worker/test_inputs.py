from __future__ import annotations

import torch

from vllm_volta.attention.metadata import build_attn_metadata, compute_positions
from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import ScheduledRequest
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.worker.inputs import padded_logits_rows, prepare_inputs


def scheduled(tokens, num_computed, num_new, block_ids):
    req = Request("r%d" % len(tokens), tokens, SamplingParams(), max_tokens=4, block_size=4)
    return ScheduledRequest.make(req, num_new, num_computed, block_ids)


def test_matches_reference_metadata_for_mixed_batch():
    # A decode, a prefix-hit prefill, a partial (chunked) prefill and a fresh prefill.
    batch = [
        scheduled(list(range(10, 19)), 8, 1, [3, 5, 9]),
        scheduled(list(range(30, 43)), 8, 5, [1, 2, 4, 6]),
        scheduled(list(range(50, 70)), 4, 6, [7, 8, 10]),
        scheduled([1, 2], 0, 2, [11]),
    ]
    inp = prepare_inputs(batch, 4, torch.device("cpu"))
    num_computed = [s.num_computed_tokens for s in batch]
    num_new = [s.num_new_tokens for s in batch]
    ref = build_attn_metadata(num_computed, num_new, [s.block_ids for s in batch], 4)
    md = inp.attn_metadata
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping",
                 "query_start_loc_cpu", "seq_lens_cpu"):
        assert torch.equal(getattr(md, name), getattr(ref, name)), name
    assert (md.num_actual_tokens, md.max_query_len, md.max_seq_len) == (14, 6, 13)
    assert torch.equal(inp.positions, compute_positions(num_computed, num_new))
    expected_ids = [18] + list(range(38, 43)) + list(range(54, 60)) + [1, 2]
    assert inp.input_ids.tolist() == expected_ids
    # The partial prefill (row 2) samples nothing; others sample at their last new token.
    assert inp.sample_rows == [0, 1, 3]
    # Three rows padded to four (padded_logits_rows): the padding repeats row 0.
    assert inp.logits_indices.tolist() == [0, 5, 13, 0]
    assert md.slot_mapping.dtype == torch.int64 and md.block_table.dtype == torch.int32


def test_decode_batch_and_packed_views():
    """Pure decode takes the one-token path; every device view starts 16-byte aligned."""
    batch = [scheduled(list(range(10, 10 + n)), n - 1, 1, list(range(1 + 3 * i, 4 + 3 * i)))
             for i, n in enumerate([3, 9, 12, 5, 1])]
    inp = prepare_inputs(batch, 4, torch.device("cpu"))
    num_computed = [s.num_computed_tokens for s in batch]
    ref = build_attn_metadata(num_computed, [1] * 5, [s.block_ids for s in batch], 4)
    md = inp.attn_metadata
    for name in ("query_start_loc", "seq_lens", "slot_mapping"):
        assert torch.equal(getattr(md, name), getattr(ref, name)), name
    assert torch.equal(md.block_table, ref.block_table)
    assert inp.input_ids.tolist() == [s.token_ids[0] for s in batch]
    assert inp.positions.tolist() == num_computed
    assert torch.equal(inp.token_table, torch.stack([inp.input_ids, inp.positions,
                                                     md.slot_mapping]))
    for t in (md.query_start_loc, md.seq_lens, md.block_table, inp.logits_indices,
              md.slot_mapping, inp.positions):
        assert t.data_ptr() % 16 == 0 or t.numel() == 0


def test_large_batch_block_table_matches_reference():
    """>= 32 rows take the flat-copy block-table path; ragged rows stay zero-padded."""
    batch = []
    next_block = 1
    for i in range(40):
        n = 1 + (7 * i) % 13  # 1..13 tokens, so 1..4 blocks of 4
        blocks = list(range(next_block, next_block + (n + 3) // 4))
        next_block += len(blocks)
        batch.append(scheduled(list(range(100 + i, 100 + i + n)), n - 1, 1, blocks))
    inp = prepare_inputs(batch, 4, torch.device("cpu"))
    num_computed = [s.num_computed_tokens for s in batch]
    ref = build_attn_metadata(num_computed, [1] * 40, [s.block_ids for s in batch], 4)
    for name in ("block_table", "slot_mapping", "seq_lens"):
        assert torch.equal(getattr(inp.attn_metadata, name), getattr(ref, name)), name


def test_logits_rows_are_bucketed():
    """Powers of two up to 256, then multiples of 256: few distinct lm_head GEMM shapes."""
    rows = {n: padded_logits_rows(n) for n in (0, 1, 2, 3, 5, 100, 129, 256, 257, 1000, 1025)}
    assert rows == {0: 0, 1: 1, 2: 2, 3: 4, 5: 8, 100: 128, 129: 256, 256: 256, 257: 512,
                    1000: 1024, 1025: 1280}
    assert len({padded_logits_rows(n) for n in range(1, 2049)}) == 8 + 8


def test_logits_hidden_skips_the_gather_only_where_it_is_the_identity():
    hidden = torch.arange(7 * 3, dtype=torch.float32).view(7, 3)

    def decode_batch(n):
        return [scheduled(list(range(10, 13 + i)), 2 + i, 1, [1 + 2 * i, 2 + 2 * i])
                for i in range(n)]

    mixed = [scheduled(list(range(10, 19)), 8, 1, [3, 5, 9]), scheduled([1, 2, 3], 0, 3, [4])]
    # 4 decode rows (a power of two: no padding), 3 rows (padded to 4), a mixed batch.
    for batch, identity in ((decode_batch(4), True), (decode_batch(3), False), (mixed, False)):
        inp = prepare_inputs(batch, 4, torch.device("cpu"))
        assert inp.logits_rows_identity is identity
        rows = inp.logits_hidden(hidden[:inp.num_tokens])
        assert torch.equal(rows, hidden[:inp.num_tokens][inp.logits_indices])


def test_state_slots_follow_the_rows_and_leave_the_rest_unchanged():
    batch = [scheduled(list(range(10, 19)), 8, 1, [3, 5, 9]),
             scheduled(list(range(30, 43)), 0, 13, [1, 2, 4, 6]),
             scheduled([1, 2, 3], 0, 3, [11])]
    for s, slot in zip(batch, (4, 1, 7)):
        s.state_slot = slot
    inp = prepare_inputs(batch, 4, torch.device("cpu"))
    md = inp.attn_metadata
    assert md.state_slots.dtype == torch.int32 and md.state_slots.tolist() == [4, 1, 7]
    ref = build_attn_metadata([8, 0, 0], [1, 13, 3], [s.block_ids for s in batch], 4,
                              state_slots=[4, 1, 7])
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping", "state_slots"):
        assert torch.equal(getattr(md, name), getattr(ref, name)), name
    assert prepare_inputs([scheduled([5], 0, 1, [2])], 4,
                          torch.device("cpu")).attn_metadata.state_slots is None
