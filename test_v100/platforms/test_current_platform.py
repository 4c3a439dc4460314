"""vllm_volta.platforms: current_platform is chosen lazily from torch.cuda.is_available()."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import vllm_volta.platforms as platforms
from vllm_volta.platforms.cpu import CpuPlatform
from vllm_volta.platforms.cuda import CudaPlatform


def test_current_platform_matches_torch(clean_env):
    from vllm_volta.platforms import current_platform

    expected = CudaPlatform if torch.cuda.is_available() else CpuPlatform
    assert type(current_platform) is expected
    assert platforms.current_platform is current_platform is platforms.get_current_platform()


@pytest.mark.parametrize("cuda,expected", [(True, CudaPlatform), (False, CpuPlatform)])
def test_choice_follows_cuda_availability(clean_env, cuda, expected):
    clean_env.setattr(platforms, "_current", None)
    clean_env.setattr(torch.cuda, "is_available", lambda: cuda)
    assert type(platforms.get_current_platform()) is expected


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no_such_thing"):
        platforms.no_such_thing  # noqa: B018


def test_import_reads_nothing_and_picks_nothing():
    # A malformed override must not break imports: it is only read when a decision is made.
    env = dict(os.environ, VLLM_VOLTA_DEVICE_CAPABILITY="abc", VLLM_VOLTA_CPU_KVCACHE_SPACE="x",
               VLLM_VOLTA_KERNEL_CONFIG_DIR="/nonexistent")
    code = ("import vllm_volta.platforms as p, vllm_volta.kernel_configs, vllm_volta.envs\n"
            "assert p._current is None\n"
            "try:\n    p.current_platform.get_device_capability() if p.current_platform.is_cuda() "
            "else p.resolve_capability_override()\nexcept ValueError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    assert "ERR VLLM_VOLTA_DEVICE_CAPABILITY='abc'" in out.stdout
