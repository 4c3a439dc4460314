"""TORCH_CUDA_ARCH_LIST parsing and the VLLM_V100_ADAPTER rule (adapter on exactly when every
target arch is below 8.0), checked by configuring CMake with the build's own arch module."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "cmake" / "arch_probe"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")


def configure(tmp_path: Path, arch_list: str | None, *, detected: str | None = None,
              torch_archs: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    if arch_list is not None:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    cmd = ["cmake", "-S", str(PROBE), "-B", str(tmp_path / "b"), f"-DVLLM_VOLTA_ROOT={REPO}",
           f"-DPROBE_TORCH_ARCHS={torch_archs}"]
    if detected is not None:
        cmd.append(f"-DVLLM_VOLTA_DETECTED_ARCHS={detected}")
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def decision(tmp_path: Path, arch_list: str | None, **kw) -> tuple[list[str], bool, str]:
    proc = configure(tmp_path, arch_list, **kw)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"PROBE_RESULT archs=(\S*) adapter=(ON|OFF)", proc.stdout)
    return m.group(1).split(";"), m.group(2) == "ON", proc.stdout


@pytest.mark.parametrize("arch_list,archs,adapter", [
    ("7.0", ["70-real"], True),
    ("7.0 7.5", ["70-real", "75-real"], True),
    ("7.0;7.5", ["70-real", "75-real"], True),
    ("7.5+PTX", ["75"], True),
    ("7.0;8.0", ["70-real", "80-real"], False),
    ("8.0;9.0", ["80-real", "90-real"], False),
    ("9.0a", ["90a-real"], False),
    ("Volta Turing", ["70-real", "75-real"], True),
    (" 7.0 , 8.6+PTX ", ["70-real", "86"], False),
])
def test_arch_list_forms_and_adapter_rule(tmp_path, arch_list, archs, adapter):
    got_archs, got_adapter, log = decision(tmp_path, arch_list)
    assert (got_archs, got_adapter) == (archs, adapter)
    # The build log says which archs and whether/why the adapter is on.
    assert "vllm_volta: CUDA target archs" in log
    assert f"VLLM_V100_ADAPTER={'ON' if adapter else 'OFF'} because" in log


@pytest.mark.parametrize("detected,archs,adapter", [
    ("7.0", ["70-real"], True),
    ("7.0;7.5", ["70-real", "75-real"], True),
    ("9.0", ["90-real"], False),
    ("7.0;9.0", ["70-real", "90-real"], False),
])
def test_empty_list_uses_the_gpus_present(tmp_path, detected, archs, adapter):
    got_archs, got_adapter, log = decision(tmp_path, "", detected=detected)
    assert (got_archs, got_adapter) == (archs, adapter)
    assert "from GPUs present" in log


def test_no_gpu_and_empty_list_falls_back_to_torchs_archs(tmp_path):
    got_archs, got_adapter, _ = decision(tmp_path, None, detected="", torch_archs="7.5;8.0;9.0")
    assert (got_archs, got_adapter) == (["75-real", "80-real", "90-real"], False)


@pytest.mark.parametrize("bad", ["sm_70", "7", "7.0+ptx", "Pascal"])
def test_bad_entries_are_a_clear_configure_error(tmp_path, bad):
    proc = configure(tmp_path, bad)
    assert proc.returncode != 0
    assert f"TORCH_CUDA_ARCH_LIST entry '{bad}' is not understood" in proc.stderr
