"""stage_decode_inputs (CUDA kernel): a decode step's rows land in a CUDA graph's larger static
buffers exactly as plain slice copies put them (ids replaced when given; everything past the step's
rows and columns untouched); and its argument checks (Meta kernel: run on CPU too)."""

from __future__ import annotations

import re

import pytest
import torch

from vllm_volta import _custom_ops as ops

from .op_cases import requires_gpu


def _buffers(n: int, max_blocks: int, device: str):
    g = torch.Generator().manual_seed(n)
    token_table = torch.randint(-9, 9, (3, n), generator=g, dtype=torch.int64)
    seq_lens = torch.randint(1, 9, (n,), generator=g, dtype=torch.int32)
    block_table = torch.randint(0, 9, (n, max_blocks), generator=g, dtype=torch.int32)
    return token_table.to(device), seq_lens.to(device), block_table.to(device)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("rows,width", [(1, 40), (3, 1), (200, 33), (1024, 512)])
@pytest.mark.parametrize("replace_ids", [False, True])
def test_stage_equals_slice_copies(rows, width, replace_ids):
    n, max_blocks = 1024, 512
    g = torch.Generator().manual_seed(rows * width)
    # Sources as the step's packed inputs hold them: the token table's rows strided (a view of a
    # wider buffer), the block table [B, W].
    wide = torch.randint(0, 1 << 40, (3, rows + 6), generator=g, dtype=torch.int64).cuda()
    src_tokens = wide[:, :rows]
    src_lens = torch.randint(1, 1 << 20, (rows,), generator=g, dtype=torch.int32).cuda()
    src_blocks = torch.randint(0, 1 << 30, (rows, width), generator=g, dtype=torch.int32).cuda()
    ids = torch.randint(0, 1 << 17, (rows,), generator=g, dtype=torch.int64).cuda() if replace_ids else None

    expected = _buffers(n, max_blocks, "cuda")
    token_table, seq_lens, block_table = (t.clone() for t in expected)
    expected[0][:, :rows] = src_tokens
    if ids is not None:
        expected[0][0, :rows] = ids
    expected[1][:rows] = src_lens
    expected[2][:rows, :width] = src_blocks

    ops.stage_decode_inputs(token_table, seq_lens, block_table, src_tokens, src_lens, src_blocks, ids)
    assert torch.equal(token_table, expected[0])
    assert torch.equal(seq_lens, expected[1])
    assert torch.equal(block_table, expected[2])


def _meta_args(**overrides):
    meta = dict(device="meta")
    args = dict(token_table=torch.empty(3, 8, dtype=torch.int64, **meta),
                seq_lens=torch.empty(8, dtype=torch.int32, **meta),
                block_table=torch.empty(8, 16, dtype=torch.int32, **meta),
                src_token_table=torch.empty(3, 10, dtype=torch.int64, **meta)[:, :2],
                src_seq_lens=torch.empty(2, dtype=torch.int32, **meta),
                src_block_table=torch.empty(2, 5, dtype=torch.int32, **meta),
                input_ids=torch.empty(2, dtype=torch.int64, **meta))
    args.update(overrides)
    return args


def _meta(*shape, dtype=torch.int32):
    return torch.empty(*shape, dtype=dtype, device="meta")


BAD_ARGS = [
    (dict(token_table=_meta(3, 8)), "'token_table' must be a 2-D int64 tensor"),
    (dict(src_block_table=_meta(2, 5, dtype=torch.int64)), "'src_block_table' must be a 2-D int32 tensor"),
    (dict(block_table=_meta(16, 8).t()), "'block_table' must be contiguous in its last dimension"),
    (dict(seq_lens=_meta(8, 2)[:, 0]), "'seq_lens' must be a contiguous 1-D int32 tensor"),
    (dict(seq_lens=_meta(9)), "'token_table' must be [3, N] and 'block_table' [N, max_blocks] for 'seq_lens' [N] (N = 9)"),
    (dict(src_seq_lens=_meta(9), src_token_table=_meta(3, 9, dtype=torch.int64), src_block_table=_meta(9, 5),
          input_ids=None), "the step has 9 rows but the buffers hold 8"),
    (dict(src_seq_lens=_meta(3)), "'src_token_table' must be [3, B] and 'src_block_table' [B, W] for 'src_seq_lens' [B] (B = 3)"),
    (dict(src_block_table=_meta(2, 17)), "'src_block_table' has 17 columns, more than 'block_table' (16)"),
    (dict(input_ids=_meta(3, dtype=torch.int64)), "'input_ids' must have one entry per row (2)"),
    (dict(input_ids=_meta(2)), "'input_ids' must be a contiguous 1-D int64 tensor"),
    (dict(src_seq_lens=torch.empty(2, dtype=torch.int32)), "'src_seq_lens' and 'token_table' must be on the same device"),
]


@pytest.mark.parametrize("overrides,message", BAD_ARGS)
def test_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"stage_decode_inputs: {message}")):
        torch.ops._C.stage_decode_inputs(**_meta_args(**overrides))


def test_valid_meta_args_pass():
    torch.ops._C.stage_decode_inputs(**_meta_args())
    torch.ops._C.stage_decode_inputs(**_meta_args(input_ids=None))
