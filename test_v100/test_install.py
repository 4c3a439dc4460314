"""Real `pip install -e .` runs of a copy of the source tree into throwaway venvs, each through
the venv's own pip without activating it: with build isolation on and a fake CUDA toolkit on
PATH (CPU torch in the target: a CPU build that loads), without torch in the target (stops
before compiling, naming the fix), and with --no-build-isolation under an old cmake first on
PATH (the environment's cmake is used)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
_SKIP_COPY = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")


def copy_source(dest: Path) -> Path:
    """What an install reads: build files, csrc/ and the package (no build outputs)."""
    dest.mkdir()
    for name in ("setup.py", "pyproject.toml", "CMakeLists.txt", "README.md",
                 "requirements-build.txt"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("cmake", "csrc", "vllm_volta"):
        shutil.copytree(REPO / name, dest / name, ignore=_SKIP_COPY)
    return dest


def make_venv(path: Path, *, system_site_packages: bool, with_pip: bool = True) -> Path:
    venv.create(path, system_site_packages=system_site_packages, with_pip=with_pip)
    return path / "bin" / "python"


def fake_bin(tmp: Path, name: str, body: str) -> Path:
    d = tmp / f"fake-{name}"
    d.mkdir()
    (d / name).write_text(f"#!/bin/sh\n{body}\n")
    (d / name).chmod(0o755)
    return d


def pip_install(python: Path, src: Path, *extra: str, path_prefix: Path | None = None,
                own_pip: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("VLLM_VOLTA_")}
    env["MAX_JOBS"] = str(os.cpu_count() or 1)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    # The venv's own pip, the venv not activated; or this pip installing into it (--python).
    pip = [str(python.parent / "pip")] if own_pip else [sys.executable, "-m", "pip", "--python", str(python)]
    return subprocess.run([*pip, "install", "-v", "--no-deps", *extra, "-e", str(src)],
                          cwd=src, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def venv_with_this_torch(tmp_path_factory):
    """A venv that sees this interpreter's torch (--system-site-packages), and a source copy."""
    tmp = tmp_path_factory.mktemp("install")
    return tmp, make_venv(tmp / "venv", system_site_packages=True), copy_source(tmp / "src")


@pytest.fixture
def cpu_venv(venv_with_this_torch):
    if torch.version.cuda is not None:
        pytest.skip("needs a CPU-only torch in this interpreter")
    return venv_with_this_torch


def loaded_extension(python: Path, src: Path) -> str:
    code = ("import torch, vllm_volta._C as c; "
            "print(c.__file__, c.BUILT_WITH_CUDA, hasattr(torch.ops._C, 'rms_norm'))")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/",
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_isolated_install_with_cpu_torch_and_fake_nvcc_builds_a_loading_cpu_extension(cpu_venv):
    tmp, python, src = cpu_venv
    nvcc_dir = fake_bin(tmp, "nvcc", 'echo "fake nvcc must not run" >&2; exit 1')
    proc = pip_install(python, src, path_prefix=nvcc_dir)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "build isolation is on" in log and "is CPU-only: building the CPU kernels only" in log
    assert "fake nvcc must not run" not in log
    assert loaded_extension(python, src) == f"{src / 'vllm_volta' / '_C.abi3.so'} 0 True"


def test_no_isolation_from_an_unactivated_venv_ignores_an_old_cmake_on_path(cpu_venv):
    tmp, python, src = cpu_venv
    old_cmake = fake_bin(tmp, "cmake", 'echo "cmake version 3.25.1"')
    proc = pip_install(python, src, "--no-build-isolation", path_prefix=old_cmake)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "3.26 or higher is required" not in log
    assert f"at {old_cmake / 'cmake'}" not in log and "vllm_volta: cmake " in log
    assert loaded_extension(python, src).endswith(" 0 True")


def test_isolated_install_without_torch_stops_before_compiling(tmp_path):
    python = make_venv(tmp_path / "venv", system_site_packages=False, with_pip=False)
    src = copy_source(tmp_path / "src")
    proc = pip_install(python, src, own_pip=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "has none: install torch first" in log and "--no-build-isolation -e ." in log
    assert not (src / "build" / "cmake" / "CMakeCache.txt").exists()  # nothing configured
    assert not (src / "vllm_volta" / "_C.abi3.so").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and a CUDA torch")
def test_isolated_install_with_a_cuda_torch_builds_a_loading_cuda_extension(venv_with_this_torch):
    """On a GPU machine: plain `pip install -e .` (isolation on) builds CUDA kernels against the
    installed CUDA torch, for the GPU present, and the extension loads."""
    tmp, python, src = venv_with_this_torch
    proc = pip_install(python, src)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert f"has CUDA {torch.version.cuda}: building CUDA kernels with nvcc" in log
    assert loaded_extension(python, src) == f"{src / 'vllm_volta' / '_C.abi3.so'} 1 True"
