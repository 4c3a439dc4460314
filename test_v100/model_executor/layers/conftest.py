from __future__ import annotations

import pytest

from vllm_volta.model_executor.layers import parallel_state


@pytest.fixture
def set_tp():
    """Call set_tp(rank, size) to simulate a tensor-parallel rank; restored to (0, 1) after."""
    yield parallel_state.set_tensor_parallel
    parallel_state.set_tensor_parallel(0, 1)
