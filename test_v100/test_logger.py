"""vllm_volta.logger: one root logger whose level follows VLLM_VOLTA_LOGGING_LEVEL; log-once helpers."""

from __future__ import annotations

import logging

import pytest

from vllm_volta import logger as vv_logger


pytestmark = pytest.mark.usefixtures("clean_env")  # test_v100/conftest.py


def test_logging_level_env_drives_the_logger(clean_env):
    root = logging.getLogger(vv_logger.ROOT_LOGGER_NAME)
    try:
        clean_env.setenv("VLLM_VOLTA_LOGGING_LEVEL", "WARNING")
        vv_logger.configure_root_logger(force=True)
        log = vv_logger.init_logger("vllm_volta.some.module")
        assert log.name == "vllm_volta.some.module"
        assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)
        clean_env.setenv("VLLM_VOLTA_LOGGING_LEVEL", "DEBUG")
        vv_logger.configure_root_logger(force=True)
        assert log.isEnabledFor(logging.DEBUG)
        # Reconfiguring does not stack handlers, and lines do not leak to the root logger.
        assert sum(getattr(h, "_vllm_volta", False) for h in root.handlers) == 1
        assert root.propagate is False
        # Loggers of other names are placed under the vllm_volta root.
        assert vv_logger.init_logger("benchmarks.kernels.x").name == "vllm_volta.benchmarks.kernels.x"
    finally:
        clean_env.delenv("VLLM_VOLTA_LOGGING_LEVEL")
        vv_logger.configure_root_logger(force=True)


def test_log_once(caplog):
    root = logging.getLogger(vv_logger.ROOT_LOGGER_NAME)
    root.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger=vv_logger.ROOT_LOGGER_NAME)
    try:
        vv_logger.reset_log_once()
        log = vv_logger.init_logger("vllm_volta.test_once")
        emitted = [vv_logger.info_once(log, "value %d", 1) for _ in range(3)]
        emitted.append(vv_logger.warning_once(log, "value %d", 1))  # another level: new line
        emitted.append(vv_logger.info_once(log, "value %d", 2))
        # A line below the level is not remembered: it shows once the level allows it.
        emitted.append(vv_logger.log_once(log, logging.DEBUG, "quiet"))
        caplog.set_level(logging.DEBUG, logger=vv_logger.ROOT_LOGGER_NAME)
        emitted.append(vv_logger.log_once(log, logging.DEBUG, "quiet"))
        assert emitted == [True, False, False, True, True, False, True]
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("INFO", "value 1"), ("WARNING", "value 1"), ("INFO", "value 2"), ("DEBUG", "quiet")]
        # The record points at the caller, not at the helper.
        assert {r.module for r in caplog.records} == {"test_logger"}
    finally:
        root.removeHandler(caplog.handler)


def test_lines_follow_a_redirected_stdout():
    """Logging set up before stdout is diverted still writes to the diverted stream (the
    benchmarks import vllm_volta at module level, then divert stdout to keep theirs for JSON)."""
    import contextlib
    import io

    vv_logger.configure_root_logger()
    log = vv_logger.init_logger("vllm_volta.redirect_test")
    diverted = io.StringIO()
    with contextlib.redirect_stdout(diverted):
        log.warning("a line for the diverted stream")
    assert "a line for the diverted stream" in diverted.getvalue()
