"""Attention backend selection: priority order, reasons, forcing, and the real registry."""

from __future__ import annotations

import importlib

import pytest
import torch

from vllm_volta.platforms import (
    register_attn_backend,
    registered_attn_backends,
    unregister_attn_backend,
)
from vllm_volta.platforms.attention_selector import select_attn_backend
from vllm_volta.platforms.cpu import CpuPlatform
from vllm_volta.platforms.cuda import CudaPlatform
from vllm_volta.platforms.interface import DeviceCapability


def _fake_backend(name: str, reasons: list[str]) -> type:
    """A backend that records its validate() calls and answers ``reasons``."""

    class Fake:
        calls: list[dict] = []

        @classmethod
        def validate(cls, **kwargs) -> list[str]:
            cls.calls.append(kwargs)
            return list(reasons)

        @staticmethod
        def get_impl_cls() -> type:
            return object

    Fake.name = name
    return Fake


@pytest.fixture
def fakes():
    """Registers GOOD, BAD and replaces the built-ins by fakes; restores the registry after."""
    before = registered_attn_backends()
    made = {
        "GOOD": _fake_backend("GOOD", []),
        "BAD": _fake_backend("BAD", ["needs a flux capacitor"]),
        "VOLTA_PAGED": _fake_backend("VOLTA_PAGED", ["head_size 80 unsupported"]),
        "TORCH_SDPA": _fake_backend("TORCH_SDPA", []),
    }
    for name, cls in made.items():
        register_attn_backend(name, cls)
    yield made
    for name in made:
        unregister_attn_backend(name)
    assert registered_attn_backends() == before


def _select(candidates, forced=None, **kw):
    args = dict(capability=DeviceCapability(7, 0), dtype=torch.float16, head_size=128,
                device_type="cuda")
    args.update(kw)
    return select_attn_backend(candidates, forced=forced, **args)


def test_first_valid_candidate_wins_and_gets_the_right_arguments(fakes):
    assert _select(["GOOD", "TORCH_SDPA"]) is fakes["GOOD"]
    assert _select(["BAD", "TORCH_SDPA", "GOOD"]) is fakes["TORCH_SDPA"]
    assert fakes["BAD"].calls[-1] == dict(capability=DeviceCapability(7, 0), dtype=torch.float16,
                                          head_size=128, device_type="cuda")
    assert not fakes["GOOD"].calls[1:]  # GOOD was never asked in the second selection


def test_choice_is_logged_once_with_the_skipped_reasons(fakes, vv_logs):
    for _ in range(3):
        _select(["BAD", "GOOD"])
    lines = [r.getMessage() for r in vv_logs.records if "attention backend" in r.getMessage()]
    assert len(lines) == 1
    assert "GOOD" in lines[0] and "BAD: needs a flux capacitor" in lines[0]


def test_error_lists_every_candidate_and_reason(fakes):
    register_attn_backend("BROKEN_IMPORT", "vllm_volta_no_such_pkg.backend.Backend")
    register_attn_backend("NO_CLASS", "vllm_volta.platforms.cpu.NoSuchBackend")
    try:
        with pytest.raises(ValueError) as info:
            _select(["BAD", "VOLTA_PAGED", "BROKEN_IMPORT", "NO_CLASS", "UNREGISTERED"])
    finally:
        unregister_attn_backend("BROKEN_IMPORT")
        unregister_attn_backend("NO_CLASS")
    msg = str(info.value)
    assert "No attention backend can run with dtype=torch.float16, head_size=128" in msg
    assert "compute capability 7.0" in msg
    assert "BAD: needs a flux capacitor" in msg
    assert "VOLTA_PAGED: head_size 80 unsupported" in msg
    assert "BROKEN_IMPORT: cannot import vllm_volta_no_such_pkg.backend: ModuleNotFoundError" in msg
    assert "NO_CLASS: vllm_volta.platforms.cpu has no class NoSuchBackend" in msg
    assert "UNREGISTERED: no backend named 'UNREGISTERED' is registered" in msg


def test_empty_candidate_list_is_an_error(fakes):
    with pytest.raises(ValueError, match="no candidates"):
        _select([])


def test_forced_backend(fakes, vv_logs):
    assert _select(["GOOD"], forced="TORCH_SDPA") is fakes["TORCH_SDPA"]
    assert any("forced by VLLM_VOLTA_ATTENTION_BACKEND" in r.getMessage() for r in vv_logs.records)
    with pytest.raises(ValueError, match=r"BAD \(forced by VLLM_VOLTA_ATTENTION_BACKEND\) cannot "
                                         r"run.*needs a flux capacitor"):
        _select(["GOOD"], forced="BAD")
    with pytest.raises(ValueError, match=r"'NOPE' is not a known attention backend.*GOOD.*TORCH_SDPA"):
        _select(["GOOD"], forced="NOPE")


def test_platform_reads_forced_backend_from_env(fakes, clean_env):
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    assert CudaPlatform().get_attn_backend(dtype=torch.float16, head_size=80) is fakes["TORCH_SDPA"]
    clean_env.setenv("VLLM_VOLTA_ATTENTION_BACKEND", "good")  # case-insensitive
    assert CudaPlatform().get_attn_backend(dtype=torch.float16, head_size=80) is fakes["GOOD"]
    assert CpuPlatform().get_attn_backend(dtype=torch.float32, head_size=80) is fakes["GOOD"]
    assert fakes["GOOD"].calls[-1]["device_type"] == "cpu"
    assert fakes["GOOD"].calls[-1]["capability"] is None


@pytest.mark.parametrize("bad", [0, -64, 64.0, True, "64"])
def test_bad_head_size(fakes, bad):
    with pytest.raises(ValueError, match="head_size must be a positive integer"):
        _select(["GOOD"], head_size=bad)


def test_registry_hook_validation_and_restore():
    with pytest.raises(ValueError, match="backend name"):
        register_attn_backend("", object)
    with pytest.raises(ValueError, match="backend target"):
        register_attn_backend("X", 42)
    builtin = registered_attn_backends()["TORCH_SDPA"]
    assert builtin == "vllm_volta.attention.backends.torch_sdpa.TorchSDPABackend"
    register_attn_backend("torch_sdpa", object)
    assert registered_attn_backends()["TORCH_SDPA"] is object
    unregister_attn_backend("TORCH_SDPA")
    assert registered_attn_backends()["TORCH_SDPA"] == builtin


def _importable(path: str) -> type | None:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - an unbuilt backend simply does not take part
        return None


@pytest.mark.parametrize("platform_cls,cap,dtype,head_size", [
    (CpuPlatform, None, torch.float32, 64), (CpuPlatform, None, torch.bfloat16, 128),
    (CudaPlatform, "7.0", torch.float16, 128), (CudaPlatform, "7.5", torch.float16, 64),
    (CudaPlatform, "9.0", torch.bfloat16, 128), (CudaPlatform, "7.0", torch.bfloat16, 128),
])
def test_real_registry(clean_env, platform_cls, cap, dtype, head_size):
    """The real backends: the pick is the first one whose own validate() accepts."""
    assert _importable(registered_attn_backends()["TORCH_SDPA"]) is not None
    if cap is not None:
        clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    p = platform_cls()
    capability = p.get_device_capability()
    expected = None
    for name in p.get_attn_backend_priority():
        cls = _importable(registered_attn_backends()[name])
        if cls is not None and not cls.validate(capability=capability, dtype=dtype,
                                                head_size=head_size, device_type=p.device_type):
            expected = cls
            break
    if expected is None:
        with pytest.raises(ValueError, match="No attention backend can run"):
            p.get_attn_backend(dtype=dtype, head_size=head_size)
    else:
        assert p.get_attn_backend(dtype=dtype, head_size=head_size) is expected
    if platform_cls is CpuPlatform:
        assert expected is not None and expected.name == "TORCH_SDPA"
    if cap == "7.0" and dtype == torch.bfloat16:
        assert expected is None  # no backend may run bf16 on Volta
