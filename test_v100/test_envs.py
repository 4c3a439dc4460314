"""vllm_volta.envs: every variable parsed lazily, with clear errors."""

from __future__ import annotations

import os

import pytest

from vllm_volta import envs


pytestmark = pytest.mark.usefixtures("clean_env")  # test_v100/conftest.py


def test_defaults(clean_env, tmp_path):
    clean_env.delenv("XDG_CACHE_HOME", raising=False)
    assert envs.VLLM_VOLTA_DEVICE_CAPABILITY is None
    assert envs.VLLM_VOLTA_LOGGING_LEVEL == "INFO"
    assert envs.VLLM_VOLTA_KERNEL_CONFIG_DIR is None
    assert envs.VLLM_VOLTA_CACHE_ROOT == os.path.join(os.path.expanduser("~"), ".cache", "vllm_volta")
    assert envs.VLLM_VOLTA_CPU_KVCACHE_SPACE == 4.0
    assert envs.cpu_kvcache_space_bytes() == 4 * 2**30
    assert envs.VLLM_VOLTA_ATTENTION_BACKEND is None
    assert envs.VLLM_VOLTA_DECODE_GEMV is True
    assert envs.VLLM_VOLTA_PDL is True
    assert envs.VLLM_VOLTA_CUDA_GRAPH_CAPTURE == "driver"
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
    for text, value in (("0", False), ("Off", False), ("false", False), ("1", True), ("yes", True)):
        clean_env.setenv("VLLM_VOLTA_DECODE_GEMV", text)
        assert envs.VLLM_VOLTA_DECODE_GEMV is value
        clean_env.setenv("VLLM_VOLTA_PDL", text)
        assert envs.VLLM_VOLTA_PDL is value
    clean_env.setenv("VLLM_VOLTA_CUDA_GRAPH_CAPTURE", "Torch")
    assert envs.VLLM_VOLTA_CUDA_GRAPH_CAPTURE == "torch"


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
    ("VLLM_VOLTA_DECODE_GEMV", "maybe", "1/0, true/false, yes/no or on/off"),
    ("VLLM_VOLTA_PDL", "sometimes", "1/0, true/false, yes/no or on/off"),
    ("VLLM_VOLTA_CUDA_GRAPH_CAPTURE", "cupy", "driver or torch"),
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
             "VLLM_VOLTA_CPU_KVCACHE_SPACE", "VLLM_VOLTA_ATTENTION_BACKEND", "VLLM_VOLTA_DECODE_GEMV",
             "VLLM_VOLTA_PDL", "VLLM_VOLTA_CUDA_GRAPH_CAPTURE", "VLLM_VOLTA_ENGINE_FAULT_AFTER_STEPS",
             "VLLM_TUNED_CONFIG_FOLDER", "VLLM_VOLTA_FORCE_CPU", "VLLM_VOLTA_CUDART",
             "VLLM_PP_LAYER_PARTITION"}
    assert set(envs.ENV_VARS) == names
    assert all(len(v.doc) > 20 for v in envs.ENV_VARS.values())
    assert names <= set(dir(envs))
    with pytest.raises(AttributeError):
        envs.VLLM_VOLTA_NOT_A_VARIABLE  # noqa: B018
    with pytest.raises(KeyError):
        envs.get("HOME")
