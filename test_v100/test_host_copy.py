"""host_copy.to_device: the values and dtype arrive; on CUDA the copy does not wait for the
work already queued on the stream (the point of the helper)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_volta.host_copy import to_device


@pytest.mark.parametrize("data", [[[1, 2], [3, 4]], np.array([[1, 2], [3, 4]]),
                                  torch.tensor([[1, 2], [3, 4]])])
def test_cpu_values_and_dtype(data):
    out = to_device(data, "cpu", torch.int32)
    assert out.dtype == torch.int32 and out.device.type == "cpu"
    assert out.tolist() == [[1, 2], [3, 4]]


def test_keeps_dtype_when_none_given():
    assert to_device(np.arange(3, dtype=np.int64), "cpu").dtype == torch.int64
    assert to_device([0.5, 1.5], "cpu").dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_copy_does_not_wait_for_queued_work():
    device = torch.device("cuda")
    torch.cuda.synchronize()
    busy_done = torch.cuda.Event()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued ahead of the copy
    busy_done.record()
    values = list(range(1000))
    out = to_device(values, device, torch.int64)
    # A copy from pageable memory would have returned only after the sleep finished.
    assert not busy_done.query()
    torch.cuda.synchronize()
    assert out.device.type == "cuda" and out.cpu().tolist() == values


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_copy_stream_transfer_runs_beside_queued_work_and_is_ordered_before_its_use():
    device = torch.device("cuda")
    copy_stream = torch.cuda.Stream(device)
    values = list(range(5000))
    # Once untimed: the copy stream's first allocation and the multiply kernel's first (lazily
    # loading, device-synchronizing) launch.
    to_device(values, device, torch.int64, copy_stream=copy_stream) * 2
    torch.cuda.synchronize()
    busy_done = torch.cuda.Event()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued on the current stream
    busy_done.record()
    out = to_device(values, device, torch.int64, copy_stream=copy_stream)
    doubled = out * 2  # on the current stream: after the copy (it waits for copy_stream)
    copy_stream.synchronize()  # the transfer is done while the queued work still runs
    assert not busy_done.query()
    torch.cuda.synchronize()
    assert doubled.cpu().tolist() == [2 * v for v in values]
