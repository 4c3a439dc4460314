"""Fixtures for the platform tests: a clean VLLM_VOLTA_* environment and captured log lines."""

from __future__ import annotations

import logging
import os

import pytest

from vllm_volta.logger import ROOT_LOGGER_NAME, reset_log_once


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No VLLM_VOLTA_* variable from the outer environment leaks into a test."""
    for name in list(os.environ):
        if name.startswith("VLLM_VOLTA_"):
            monkeypatch.delenv(name)
    reset_log_once()
    return monkeypatch


@pytest.fixture
def vv_logs(caplog: pytest.LogCaptureFixture):
    """caplog wired to the "vllm_volta" logger, which does not propagate to the root."""
    root = logging.getLogger(ROOT_LOGGER_NAME)
    root.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger=ROOT_LOGGER_NAME)
    yield caplog
    root.removeHandler(caplog.handler)

