"""vllm_volta.envs: every variable parsed lazily with clear errors; the logger follows its level."""

from __future__ import annotations

import logging
import os

import pytest

from vllm_volta import envs, logger as vv_logger


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("VLLM_VOLTA_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults(clean_env, tmp_path):
    clean_env.delenv("XDG_CACHE_HOME", raising=False)
    assert envs.VLLM_VOLTA_DEVICE_CAPABILITY is None
    assert envs.VLLM_VOLTA_LOGGING_LEVEL == "INFO"
    assert envs.VLLM_VOLTA_KERNEL_CONFIG_DIR is None
    assert envs.VLLM_VOLTA_CACHE_ROOT == os.path.join(os.path.expanduser("~"), ".cache", "vllm_volta")
    assert envs.VLLM_VOLTA_CPU_KVCACHE_SPACE == 4.0
    assert envs.cpu_kvcache_space_bytes() == 4 * 2**30
    assert envs.VLLM_VOLTA_ATTENTION_BACKEND is None
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert envs.VLLM_VOLTA_CACHE_ROOT == str(tmp_path / "vllm_volta")


def test_values_are_read_at_access_time(clean_env, tmp_path):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.5")
    assert envs.VLLM_VOLTA_DEVICE_CAPABILITY == (7, 5)
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "90")
    assert envs.VLLM_VOLTA_DEVICE_CAPABILITY == (9, 0)
    clean_env.setenv("VLLM_VOLTA_LOGGING_LEVEL", "debug")
    assert envs.VLLM_VOLTA_LOGGING_LEVEL == "DEBUG"
    clean_env.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path / "cfg"))
    assert envs.VLLM_VOLTA_KERNEL_CONFIG_DIR == str(tmp_path / "cfg")
    clean_env.setenv("VLLM_VOLTA_CACHE_ROOT", "~/somewhere")
    assert envs.VLLM_VOLTA_CACHE_ROOT == os.path.join(os.path.expanduser("~"), "somewhere")
    clean_env.setenv("VLLM_VOLTA_CPU_KVCACHE_SPACE", "0.25")
    assert envs.cpu_kvcache_space_bytes() == 2**28
    clean_env.setenv("VLLM_VOLTA_ATTENTION_BACKEND", "torch_sdpa")
    assert envs.VLLM_VOLTA_ATTENTION_BACKEND == "TORCH_SDPA"
    clean_env.setenv("VLLM_VOLTA_ATTENTION_BACKEND", "")
    assert envs.VLLM_VOLTA_ATTENTION_BACKEND is None


@pytest.mark.parametrize("name,bad,expected_form", [
    ("VLLM_VOLTA_DEVICE_CAPABILITY", "abc", '"7.0"'),
    ("VLLM_VOLTA_DEVICE_CAPABILITY", "7", '"7.0"'),
    ("VLLM_VOLTA_DEVICE_CAPABILITY", "-1.0", '"7.0"'),
    ("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0.1", '"7.0"'),
    ("VLLM_VOLTA_LOGGING_LEVEL", "LOUD", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("VLLM_VOLTA_CPU_KVCACHE_SPACE", "lots", "positive number of GiB"),
    ("VLLM_VOLTA_CPU_KVCACHE_SPACE", "0", "positive number of GiB"),
    ("VLLM_VOLTA_CPU_KVCACHE_SPACE", "-2", "positive number of GiB"),
    ("VLLM_VOLTA_CPU_KVCACHE_SPACE", "inf", "positive number of GiB"),
    ("VLLM_VOLTA_CPU_KVCACHE_SPACE", "nan", "positive number of GiB"),
])
def test_bad_values_name_the_variable_and_the_form(clean_env, name, bad, expected_form):
    clean_env.setenv(name, bad)
    with pytest.raises(ValueError) as info:
        getattr(envs, name)
    assert f"{name}={bad!r}" in str(info.value)
    assert expected_form in str(info.value)


def test_registry_is_documented_and_complete():
    names = {"VLLM_VOLTA_DEVICE_CAPABILITY", "VLLM_VOLTA_LOGGING_LEVEL",
             "VLLM_VOLTA_KERNEL_CONFIG_DIR", "VLLM_VOLTA_CACHE_ROOT",
             "VLLM_VOLTA_CPU_KVCACHE_SPACE", "VLLM_VOLTA_ATTENTION_BACKEND"}
    assert set(envs.ENV_VARS) == names
    assert all(len(v.doc) > 20 for v in envs.ENV_VARS.values())
    assert names <= set(dir(envs))
    with pytest.raises(AttributeError):
        envs.VLLM_VOLTA_NOT_A_VARIABLE  # noqa: B018
    with pytest.raises(KeyError):
        envs.get("HOME")


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
        assert {r.module for r in caplog.records} == {"test_envs"}
    finally:
        root.removeHandler(caplog.handler)
