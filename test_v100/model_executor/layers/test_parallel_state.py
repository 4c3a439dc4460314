from __future__ import annotations

import pytest
import torch

from vllm_volta.model_executor.layers import parallel_state as ps


def test_defaults_are_single_rank():
    assert ps.get_tensor_model_parallel_rank() == 0
    assert ps.get_tensor_model_parallel_world_size() == 1
    x = torch.randn(3)
    assert ps.tensor_model_parallel_all_reduce(x) is x
    assert ps.tensor_model_parallel_all_gather(x) is x


def test_set_and_validate(set_tp):
    set_tp(1, 2)
    assert (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()) == (1, 2)
    with pytest.raises(ValueError, match="rank"):
        set_tp(2, 2)
    with pytest.raises(ValueError, match="size"):
        set_tp(0, 0)


def test_divide():
    assert ps.divide(12, 4, "heads") == 3
    with pytest.raises(ValueError, match="heads"):
        ps.divide(10, 4, "heads")
