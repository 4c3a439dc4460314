"""PinnedIdsPool: pinned int64 buffers, one per launched step, reused only after release."""
from __future__ import annotations

import pytest
import torch

from vllm_volta.worker.pinned_ids import PinnedIdsPool

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")]


def test_buffers_are_pinned_and_reused_only_after_release():
    pool = PinnedIdsPool(min_rows=4)
    a = pool.acquire(3)
    b = pool.acquire(3)  # a is still in use (its step not read yet)
    assert a.is_pinned() and a.dtype == torch.int64 and a.numel() == 4
    assert a.data_ptr() != b.data_ptr() and pool.num_buffers == 2
    pool.release(a)
    assert pool.acquire(2).data_ptr() == a.data_ptr()
    big = pool.acquire(9)  # no free buffer is large enough
    assert big.numel() == 9 and pool.num_buffers == 3
    pool.release(b)
    pool.release(big)
    assert pool.acquire(6).data_ptr() == big.data_ptr()  # the first free one that fits
