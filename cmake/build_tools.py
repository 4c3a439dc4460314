"""Which cmake, ninja and nvcc the build of vllm_volta._C runs (imported by setup.py).

The build uses the tools of the environment it installs into, not whatever comes first on
PATH: an unactivated venv (``venv/bin/pip install ...``) has its own cmake next to its
interpreter, and pip's build isolation puts one in the build environment, while PATH may still
lead to an older system cmake. Kept free of setuptools and torch so tests can call it directly.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Callable, Iterable, Mapping

MIN_CMAKE = (3, 26)
REQUIREMENTS_HINT = "{python} -m pip install -r requirements-build.txt"


class BuildStop(Exception):
    """The build cannot produce a working extension; the message says what to run instead."""


def _module_dir(module: str, attr: str) -> Path | None:
    """A directory a tool's Python package exports (cmake.CMAKE_BIN_DIR, ninja.BIN_DIR)."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        mod = __import__(module)
    except Exception:  # a broken package is just not a candidate
        return None
    value = getattr(mod, attr, None)
    return Path(value) if value else None


def interpreter_bin_dirs(python: str = sys.executable) -> list[Path]:
    """Where an interpreter's environment keeps its scripts (venv/bin, the prefix's bin)."""
    dirs = [Path(sysconfig.get_path("scripts")), Path(python).parent]
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def tool_candidates(name: str, *, module_dir: Path | None, bin_dirs: Iterable[Path],
                    path_env: str | None) -> list[Path]:
    """Candidate executables in order of preference: the tool's Python package (the build
    environment's under isolation, else the target's), the interpreter's bin dirs, then PATH."""
    found: list[Path] = []
    for d in [module_dir, *bin_dirs]:
        if d is not None and (d / name).is_file() and os.access(d / name, os.X_OK):
            found.append(d / name)
    on_path = shutil.which(name, path=path_env)
    if on_path:
        found.append(Path(on_path))
    unique: list[Path] = []
    for p in found:
        if p not in unique:
            unique.append(p)
    return unique


def parse_version(text: str) -> tuple[int, ...] | None:
    """The first dotted version number in a tool's --version output."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def tool_version(path: Path) -> tuple[int, ...] | None:
    """``<tool> --version``, parsed; None if it does not run or says nothing parseable."""
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return parse_version(proc.stdout + proc.stderr)


def _fmt(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "unknown version"


def pick_tool(name: str, candidates: list[Path], *, min_version: tuple[int, ...] | None,
              version_of: Callable[[Path], tuple[int, ...] | None] = tool_version,
              python: str = sys.executable) -> tuple[Path, tuple[int, ...] | None]:
    """The first candidate that runs (and is new enough); BuildStop listing what was found."""
    rejected: list[str] = []
    for path in candidates:
        version = version_of(path)
        if version is None:
            rejected.append(f"{path} (does not run)")
        elif min_version is not None and version < min_version:
            rejected.append(f"{path} ({_fmt(version)})")
        else:
            return path, version
    need = f"{name} >= {_fmt(min_version)}" if min_version else name
    seen = "; found: " + ", ".join(rejected) if rejected else "; none found"
    raise BuildStop(f"vllm_volta needs {need} in the environment it installs into{seen}. "
                    f"Run: {REQUIREMENTS_HINT.format(python=python)}")


def find_build_tools(environ: Mapping[str, str], python: str = sys.executable
                     ) -> dict[str, tuple[Path, tuple[int, ...] | None]]:
    """cmake (>= 3.26) and ninja for this build, with their versions."""
    bins = interpreter_bin_dirs(python)
    path_env = environ.get("PATH")
    cmake = pick_tool("cmake", tool_candidates(
        "cmake", module_dir=_module_dir("cmake", "CMAKE_BIN_DIR"), bin_dirs=bins,
        path_env=path_env), min_version=MIN_CMAKE, python=python)
    ninja = pick_tool("ninja", tool_candidates(
        "ninja", module_dir=_module_dir("ninja", "BIN_DIR"), bin_dirs=bins, path_env=path_env),
        min_version=None, python=python)
    return {"cmake": cmake, "ninja": ninja}


def nvcc_version(path: Path) -> tuple[int, int] | None:
    """The CUDA release an nvcc compiles for ("release 12.6" in ``nvcc --version``)."""
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+)\.(\d+)", proc.stdout)
    return (int(m.group(1)), int(m.group(2))) if proc.returncode == 0 and m else None


def find_nvcc(environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """nvcc from CUDA_HOME / CUDA_PATH, else PATH, else /usr/local/cuda; and where it came from."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        if not nvcc.is_file():
            raise BuildStop(f"CUDA_HOME={home} has no bin/nvcc: point CUDA_HOME at a CUDA toolkit "
                            "(the folder holding bin/nvcc), or unset it")
        return nvcc, "CUDA_HOME"
    on_path = shutil.which("nvcc", path=environ.get("PATH"))
    if on_path:
        return Path(on_path), "PATH"
    default = Path("/usr/local/cuda/bin/nvcc")
    if default.is_file():
        return default, "/usr/local/cuda"
    return None, "not found (CUDA_HOME unset, none on PATH or in /usr/local/cuda)"
