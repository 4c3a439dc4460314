"""Build vllm_volta._C with CMake + ninja (metadata lives in pyproject.toml).

Honours TORCH_CUDA_ARCH_LIST (read by CMakeLists.txt), MAX_JOBS (parallel compile
jobs), CUDA_HOME (which nvcc to use), VLLM_VOLTA_FORCE_CPU=1 (CPU kernels only) and
VLLM_VOLTA_CUDART=static|shared (how the CUDA runtime is linked). Editable installs put the extension next to
the sources (vllm_volta/_C.abi3.so), so `python -m pytest` from the repo root finds it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    """An extension whose sources are built by CMakeLists.txt, not by setuptools."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[], py_limited_api=True)


def _num_jobs() -> int:
    jobs = os.environ.get("MAX_JOBS")
    if jobs is None:
        return os.cpu_count() or 1
    if not jobs.isdigit() or int(jobs) < 1:
        raise ValueError(f"MAX_JOBS must be a positive integer, got {jobs!r}")
    return int(jobs)


class CMakeBuild(build_ext):
    """Configure + build with CMake/ninja, then copy the module where setuptools wants it."""

    def build_extension(self, ext: Extension) -> None:
        # A fixed folder (not setuptools' per-run temp dir) keeps rebuilds incremental.
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE', 'Release')}",
        ]
        # Build knobs passed through from the environment (see CMakeLists.txt).
        args.append(f"-DVLLM_VOLTA_FORCE_CPU={'ON' if os.environ.get('VLLM_VOLTA_FORCE_CPU') == '1' else 'OFF'}")
        args.append(f"-DVLLM_VOLTA_CUDART={os.environ.get('VLLM_VOLTA_CUDART', 'static')}")
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if cuda_home:
            args += [f"-DCMAKE_CUDA_COMPILER={Path(cuda_home) / 'bin' / 'nvcc'}",
                     f"-DCUDAToolkit_ROOT={cuda_home}"]
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args])
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", str(_num_jobs())])

        built = sorted(build_dir.glob("_C*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected exactly one _C*.so in {build_dir}, found {built}")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    ext_modules=[CMakeExtension("vllm_volta._C")],
    cmdclass={"build_ext": CMakeBuild},
)
