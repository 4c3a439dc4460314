"""Fixtures for the platform tests: a clean VLLM_VOLTA_* environment and captured log lines."""

from __future__ import annotations

import logging

import pytest

from vllm_volta.logger import ROOT_LOGGER_NAME, reset_log_once


@pytest.fixture(autouse=True)
def clean_env(clean_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The suite-wide clean environment (test_v100/conftest.py), plus fresh log-once state."""
    reset_log_once()
    return clean_env


@pytest.fixture
def vv_logs(caplog: pytest.LogCaptureFixture):
    """caplog wired to the "vllm_volta" logger, which does not propagate to the root."""
    root = logging.getLogger(ROOT_LOGGER_NAME)
    root.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger=ROOT_LOGGER_NAME)
    yield caplog
    root.removeHandler(caplog.handler)

