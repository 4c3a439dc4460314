"""The install's decisions before compiling (cmake/build_target.py, cmake/build_tools.py):
which torch the extension is built against (also under pip's build isolation), CPU or CUDA,
which nvcc, cmake and ninja; each impossible case stops with one message naming the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "cmake"))
import build_target as bt  # noqa: E402
import build_tools as tools  # noqa: E402

CPU_TORCH = {"version": "2.13.0+cpu", "path": "/target/site-packages/torch", "cuda": None}
CU126_TORCH = {"version": "2.11.0+cu126", "path": "/target/site-packages/torch", "cuda": "12.6"}
TARGET_SITES = ["/target/site-packages"]


def fake_probe(torch_info: dict | None, seen_env: list):
    def probe(python: str, environ) -> dict:
        seen_env.append(dict(environ))
        return {"site_packages": TARGET_SITES, "torch": torch_info}
    return probe


def fake_nvcc_dir(tmp_path: Path, release: str | None) -> Path:
    """A directory holding an nvcc script that prints `release` (or fails: a fake toolkit)."""
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    body = (f'echo "Cuda compilation tools, release {release}, V{release}.1"' if release
            else 'echo "fake nvcc must not run" >&2; exit 1')
    (bin_dir / "nvcc").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "nvcc").chmod(0o755)
    return bin_dir


def plan(torch_info, environ, sys_path, seen=None):
    return bt.plan_build(python="/target/bin/python", environ=environ, sys_path=sys_path,
                         probe=fake_probe(torch_info, seen if seen is not None else []))


ISOLATED_ENV = {"PATH": "/usr/bin", "PYTHONPATH": "/tmp/pip-build-env-x/site",
                "PYTHONNOUSERSITE": "1"}


def test_isolation_builds_against_the_targets_cpu_torch_and_ignores_nvcc(tmp_path):
    """pip's isolation (target site-packages hidden from sys.path, a CUDA torch possibly in the
    build env) with a CPU torch in the target and a fake nvcc on PATH: a CPU build against the
    target's torch, probed with pip's overlay removed; nvcc is never run."""
    nvcc_dir = fake_nvcc_dir(tmp_path, None)
    env = dict(ISOLATED_ENV, PATH=f"{nvcc_dir}:/usr/bin")
    seen: list = []
    p = plan(CPU_TORCH, env, sys_path=["/tmp/pip-build-env-x/site"], seen=seen)
    assert p.isolated and not p.cuda and p.nvcc is None
    assert p.torch.path == CPU_TORCH["path"]
    assert "PYTHONPATH" not in seen[0] and "PYTHONNOUSERSITE" not in seen[0]
    assert "PYTHONPATH" not in p.env  # CMake's own torch query sees the target too
    assert any("build isolation is on" in n for n in p.notes)
    assert any(f"nvcc at {nvcc_dir / 'nvcc'} is not used" in n for n in p.notes)


def test_without_isolation_the_users_environment_is_kept(tmp_path):
    env = {"PATH": "/usr/bin", "PYTHONPATH": "/my/libs"}
    p = plan(CPU_TORCH, env, sys_path=["/my/libs", *TARGET_SITES])
    assert not p.isolated and p.env["PYTHONPATH"] == "/my/libs"


@pytest.mark.parametrize("torch_info,match", [
    (None, "has none: install torch first .*--no-build-isolation"),
    ({"version": "2.5.1+cu124", "path": "/t", "cuda": "12.4"}, "torch 2.5.1\\+cu124 at /t is older than 2.11"),
])
def test_missing_or_old_torch_stops_before_compiling(torch_info, match):
    with pytest.raises(tools.BuildStop, match=match):
        plan(torch_info, dict(ISOLATED_ENV), sys_path=[])


def test_cuda_torch_without_nvcc_stops_naming_both_routes():
    with pytest.raises(tools.BuildStop, match="built for CUDA 12.6, but nvcc was not found") as e:
        bt.decide_cuda(bt.TorchInfo(**CU126_TORCH), force_cpu=False, nvcc=None,
                       nvcc_where="not found (CUDA_HOME unset)", nvcc_release=None, cudart="static")
    assert "CUDA_HOME=/path/to/cuda-12.6" in str(e.value) and "VLLM_VOLTA_FORCE_CPU=1" in str(e.value)


def test_cuda_torch_with_matching_nvcc_from_cuda_home(tmp_path):
    bin_dir = fake_nvcc_dir(tmp_path, "12.6")
    p = plan(CU126_TORCH, {"PATH": "/usr/bin", "CUDA_HOME": str(bin_dir.parent)}, TARGET_SITES)
    assert p.cuda and p.nvcc == bin_dir / "nvcc"
    assert any("nvcc 12.6" in n and "CUDA_HOME" in n for n in p.notes)


def test_nvcc_major_mismatch_is_a_note_with_static_cudart_and_a_stop_with_shared(tmp_path):
    home = str(fake_nvcc_dir(tmp_path, "13.0").parent)
    p = plan(CU126_TORCH, {"PATH": "/usr/bin", "CUDA_HOME": home}, TARGET_SITES)
    assert p.cuda and any("differs from torch's 12.6" in n for n in p.notes)
    with pytest.raises(tools.BuildStop, match="differ in major version"):
        plan(CU126_TORCH, {"PATH": "/usr/bin", "CUDA_HOME": home, "VLLM_VOLTA_CUDART": "shared"},
             TARGET_SITES)


def test_bad_cuda_home_stops_a_cuda_build_but_not_a_cpu_one(tmp_path):
    env = {"PATH": "/usr/bin", "CUDA_HOME": str(tmp_path / "nowhere")}
    with pytest.raises(tools.BuildStop, match="has no bin/nvcc"):
        plan(CU126_TORCH, env, TARGET_SITES)
    assert not plan(CPU_TORCH, env, TARGET_SITES).cuda


def test_force_cpu_never_looks_for_nvcc():
    p = plan(CU126_TORCH, {"PATH": "/nowhere", "VLLM_VOLTA_FORCE_CPU": "1"}, TARGET_SITES)
    assert not p.cuda and "VLLM_VOLTA_FORCE_CPU=1" in p.notes[-1]


def test_isolation_is_read_from_the_targets_site_packages():
    assert bt.is_isolated(["/venv/lib/site-packages"], ["/tmp/overlay"])
    assert not bt.is_isolated(["/venv/lib/site-packages"], ["", "/venv/lib/site-packages"])


def test_probe_sees_this_interpreters_torch():
    import torch

    info = bt.probe_interpreter(sys.executable, os.environ)
    assert info["torch"]["version"] == torch.__version__
    assert os.path.realpath(info["torch"]["path"]) == os.path.realpath(os.path.dirname(torch.__file__))


def _script(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{path.name} version {version}'\n")
    path.chmod(0o755)
    return path


def test_tool_order_prefers_the_environment_over_path(tmp_path):
    venv_cmake = _script(tmp_path / "venv" / "bin" / "cmake", "3.31.6")
    sys_cmake = _script(tmp_path / "usr" / "bin" / "cmake", "3.25.1")
    cands = tools.tool_candidates("cmake", module_dir=None, bin_dirs=[venv_cmake.parent],
                                  path_env=str(sys_cmake.parent))
    assert cands == [venv_cmake, sys_cmake]
    assert tools.pick_tool("cmake", cands, min_version=tools.MIN_CMAKE) == (venv_cmake, (3, 31, 6))
    # PATH's cmake first but too old: the next candidate is taken.
    assert tools.pick_tool("cmake", [sys_cmake, venv_cmake], min_version=tools.MIN_CMAKE)[0] == venv_cmake


def test_only_an_old_cmake_stops_with_the_requirements_command(tmp_path):
    old = _script(tmp_path / "cmake", "3.25.1")
    with pytest.raises(tools.BuildStop, match=r"cmake >= 3\.26 .*3\.25\.1.*-m pip install -r "
                                              r"requirements-build\.txt"):
        tools.pick_tool("cmake", [old], min_version=tools.MIN_CMAKE, python="/venv/bin/python")


def test_build_tools_of_this_environment_are_found():
    found = tools.find_build_tools(os.environ)
    assert found["cmake"][1] >= tools.MIN_CMAKE and found["ninja"][0].name == "ninja"


def test_nvcc_release_is_read_from_its_version_banner(tmp_path):
    assert tools.nvcc_version(fake_nvcc_dir(tmp_path, "12.6") / "nvcc") == (12, 6)
    assert tools.nvcc_version(fake_nvcc_dir(tmp_path / "b", None) / "nvcc") is None


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_stops_when_it_sees_another_torch_than_the_plan(tmp_path):
    """setup.py passes its CPU / CUDA decision; a configure whose torch disagrees (here: a CUDA
    build expected, this CPU torch seen) stops before anything compiles."""
    import torch

    expect = "OFF" if torch.version.cuda else "ON"
    proc = subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path / "b"), "-G", "Ninja",
                           f"-DPython_EXECUTABLE={sys.executable}", f"-DVLLM_VOLTA_EXPECT_CUDA={expect}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert f"planned VLLM_VOLTA_EXPECT_CUDA={expect}" in " ".join(proc.stderr.split())
