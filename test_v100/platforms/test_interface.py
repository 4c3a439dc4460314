"""DeviceCapability, the capability predicates, the dtype rule and check_and_update_config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_volta.platforms.cpu import CpuPlatform
from vllm_volta.platforms.cuda import CudaPlatform
from vllm_volta.platforms.interface import DeviceCapability, resolve_capability_override

BF16_LINE = "bfloat16 is not supported on compute capability {}; casting to float16"


def test_capability_ordering_and_conversions():
    caps = [DeviceCapability(9, 0), DeviceCapability(7, 0), DeviceCapability(8, 6),
            DeviceCapability(7, 5), DeviceCapability(8, 0)]
    assert [c.to_int() for c in sorted(caps)] == [70, 75, 80, 86, 90]
    assert DeviceCapability(7, 5) < DeviceCapability(8, 0) <= DeviceCapability(8, 0)
    assert DeviceCapability(10, 0) > DeviceCapability(9, 9)
    assert DeviceCapability(7, 5).as_version_str() == "7.5"
    assert DeviceCapability.from_int(75) == DeviceCapability(7, 5)
    assert DeviceCapability.from_int(120) == DeviceCapability(12, 0)
    assert hash(DeviceCapability(7, 0)) == hash(DeviceCapability(7, 0))


@pytest.mark.parametrize("major,minor", [(-1, 0), (7, 10), (7.0, 0), (True, 0), ("7", 0)])
def test_capability_rejects_bad_fields(major, minor):
    with pytest.raises(ValueError, match="DeviceCapability"):
        DeviceCapability(major, minor)


@pytest.mark.parametrize("env,expected", [("7.0", (7, 0)), ("7.5", (7, 5)), ("8.0", (8, 0)),
                                          ("9.0", (9, 0)), ("75", (7, 5)), (" 8.6 ", (8, 6)),
                                          ("100", (10, 0)), ("12.0", (12, 0))])
def test_capability_override_forms(clean_env, env, expected):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", env)
    assert resolve_capability_override() == DeviceCapability(*expected)


def test_capability_override_unset_or_blank(clean_env):
    assert resolve_capability_override() is None
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "  ")
    assert resolve_capability_override() is None


@pytest.mark.parametrize("bad", ["abc", "7", "-1.0", "7.0.1", "7.", ".5", "7,0", "0.0", "sm_70", "7.10"])
def test_capability_override_bad_values(clean_env, bad):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", bad)
    with pytest.raises(ValueError, match=r"VLLM_VOLTA_DEVICE_CAPABILITY.*7\.0"):
        resolve_capability_override()
    # Every decision that depends on the capability surfaces the same error.
    with pytest.raises(ValueError, match="VLLM_VOLTA_DEVICE_CAPABILITY"):
        CudaPlatform().resolve_dtype("auto", torch.float16)


@pytest.mark.parametrize("cap", ["7.0", "7.5", "8.0", "8.6", "9.0"])
def test_capability_predicates_match_reference(clean_env, cap):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    p = CudaPlatform()
    major, minor = (int(x) for x in cap.split("."))
    value = major * 10 + minor
    assert p.get_device_capability() == DeviceCapability(major, minor)
    for n in (60, 70, 75, 80, 86, 89, 90, 100):
        assert p.has_device_capability(n) == (value >= n)
        assert p.is_device_capability(n) == (value == n)
        assert p.is_device_capability_family(n) == (major == n // 10)
        assert p.has_device_capability((n // 10, n % 10)) == (value >= n)
        assert p.has_device_capability(DeviceCapability.from_int(n)) == (value >= n)


def test_capability_predicates_reject_bad_argument(clean_env):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    with pytest.raises(ValueError, match="capability must be"):
        CudaPlatform().has_device_capability("7.0")
    with pytest.raises(ValueError, match="capability must be"):
        CudaPlatform().is_device_capability(-70)
    with pytest.raises(ValueError, match="capability must be"):
        CudaPlatform().has_device_capability((7, 0, 1))


def test_cpu_has_no_capability():
    p = CpuPlatform()
    assert p.get_device_capability() is None
    assert not p.has_device_capability(0)
    assert not p.is_device_capability(70)
    assert not p.is_device_capability_family(70)


# Expected dtype decisions, written out from the spec (DESIGN.md section 3 and 5):
# (capability or None for CPU, requested, config dtype) -> result.
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
DTYPE_TABLE = [
    ("7.0", "auto", BF16, F16), ("7.5", "auto", BF16, F16), ("8.0", "auto", BF16, BF16),
    ("9.0", "auto", BF16, BF16), ("7.0", "auto", F16, F16), ("9.0", "auto", F16, F16),
    ("7.0", "auto", F32, F16), ("9.0", "auto", F32, F16), ("7.0", "auto", None, F16),
    ("7.0", "half", BF16, F16), ("7.0", "float16", F32, F16), ("7.0", "float", BF16, F32),
    ("7.0", "float32", F16, F32), ("9.0", "bfloat16", F16, BF16), ("8.0", "BFloat16", F32, BF16),
    ("7.0", F16, BF16, F16), ("9.0", BF16, F16, BF16), ("7.5", F32, F16, F32),
    (None, "auto", BF16, F32), (None, "auto", F16, F32), (None, "auto", None, F32),
    (None, "bfloat16", F32, BF16), (None, "half", F32, F16), (None, F32, BF16, F32),
]


@pytest.mark.parametrize("cap,requested,config_dtype,expected", DTYPE_TABLE)
def test_resolve_dtype_table(clean_env, cap, requested, config_dtype, expected):
    if cap is None:
        p = CpuPlatform()
    else:
        clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
        p = CudaPlatform()
    assert p.resolve_dtype(requested, config_dtype) == expected


@pytest.mark.parametrize("cap", ["7.0", "7.5"])
@pytest.mark.parametrize("requested", ["bfloat16", torch.bfloat16])
def test_explicit_bfloat16_below_sm80_names_dtype_half(clean_env, cap, requested):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    with pytest.raises(ValueError, match=rf"bfloat16.*{cap}.*--dtype half"):
        CudaPlatform().resolve_dtype(requested, torch.bfloat16)


@pytest.mark.parametrize("cap", ["7.0", "7.5"])
def test_bf16_cast_logs_exactly_one_line(clean_env, vv_logs, cap):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    p = CudaPlatform()
    for _ in range(3):
        assert p.resolve_dtype("auto", torch.bfloat16) == torch.float16
    lines = [r.getMessage() for r in vv_logs.records if "bfloat16" in r.getMessage()]
    assert lines == [BF16_LINE.format(cap)]


def test_no_cast_line_when_bf16_supported_or_not_involved(clean_env, vv_logs):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "8.0")
    CudaPlatform().resolve_dtype("auto", torch.bfloat16)
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    CudaPlatform().resolve_dtype("auto", torch.float16)
    CpuPlatform().resolve_dtype("auto", torch.bfloat16)
    assert not [r for r in vv_logs.records if "casting" in r.getMessage()]


@pytest.mark.parametrize("bad", ["int8", "fp16", "", None, 16, torch.int8, torch.float64])
def test_resolve_dtype_rejects_unknown(clean_env, bad):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    with pytest.raises(ValueError, match=r"dtype must be one of 'auto', 'half'.*'float32'"):
        CudaPlatform().resolve_dtype(bad, torch.float16)


def _engine_config(block_size, disable_custom_all_reduce, cpu_space=0):
    cache = SimpleNamespace(block_size=block_size)
    if cpu_space != 0:
        cache.cpu_kvcache_space = cpu_space
    return SimpleNamespace(
        cache_config=cache,
        parallel_config=SimpleNamespace(disable_custom_all_reduce=disable_custom_all_reduce),
    )


@pytest.mark.parametrize("cap,expect_disabled", [("7.0", True), ("7.5", True), ("8.0", False),
                                                  ("9.0", False)])
def test_check_and_update_config_cuda(clean_env, cap, expect_disabled):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    cfg = _engine_config(None, False)
    CudaPlatform().check_and_update_config(cfg)
    assert cfg.cache_config.block_size == 16
    assert cfg.parallel_config.disable_custom_all_reduce is expect_disabled
    # A user's explicit choices are kept.
    cfg = _engine_config(32, True)
    CudaPlatform().check_and_update_config(cfg)
    assert cfg.cache_config.block_size == 32
    assert cfg.parallel_config.disable_custom_all_reduce is True


def test_check_and_update_config_cpu(clean_env):
    cfg = _engine_config(None, False, cpu_space=None)
    CpuPlatform().check_and_update_config(cfg)
    assert cfg.cache_config.block_size == 16
    assert cfg.parallel_config.disable_custom_all_reduce is True
    assert cfg.cache_config.cpu_kvcache_space == 4.0
    clean_env.setenv("VLLM_VOLTA_CPU_KVCACHE_SPACE", "0.5")
    cfg = _engine_config(8, True, cpu_space=None)
    CpuPlatform().check_and_update_config(cfg)
    assert cfg.cache_config.cpu_kvcache_space == 0.5
    # Missing sub-configs or fields are left alone.
    CpuPlatform().check_and_update_config(SimpleNamespace())
    bare = SimpleNamespace(cache_config=SimpleNamespace(), parallel_config=SimpleNamespace())
    CpuPlatform().check_and_update_config(bare)
    assert vars(bare.cache_config) == {} and vars(bare.parallel_config) == {}


def test_check_and_update_config_with_the_real_cache_config(clean_env):
    config = pytest.importorskip("vllm_volta.config")
    clean_env.setenv("VLLM_VOLTA_CPU_KVCACHE_SPACE", "2")
    cache = config.CacheConfig(cpu_kvcache_space=None)
    CpuPlatform().check_and_update_config(SimpleNamespace(cache_config=cache))
    assert cache.cpu_kvcache_space == 2.0 and cache.cpu_kvcache_bytes() == 2 * 1024**3
    assert cache.block_size == 16
