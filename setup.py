"""Build vllm_volta._C with CMake + ninja (metadata lives in pyproject.toml).

Honours TORCH_CUDA_ARCH_LIST (read by CMakeLists.txt), MAX_JOBS (parallel compile
jobs), CUDA_HOME (which nvcc to use), VLLM_VOLTA_FORCE_CPU=1 (CPU kernels only) and
VLLM_VOLTA_CUDART=static|shared (how the CUDA runtime is linked). Editable installs put the extension next to
the sources (vllm_volta/_C.abi3.so), so `python -m pytest` from the repo root finds it.

Before compiling, cmake/build_target.py decides which torch the extension is built against
(always the one installed for the interpreter being installed into, also under pip's build
isolation) and whether it is a CUDA build; cmake/build_tools.py picks the cmake and ninja of
that environment. Where no working extension can come out, the build stops before compiling
with one message saying what to run instead; a built library that does not load with the
target's torch is never installed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import SetupError

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "cmake"))
from build_target import BuildPlan, check_extension_loads, force_cpu_requested, plan_build  # noqa: E402
from build_tools import BuildStop, find_build_tools  # noqa: E402


class CMakeExtension(Extension):
    """An extension whose sources are built by CMakeLists.txt, not by setuptools."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[], py_limited_api=True)


def _num_jobs() -> int:
    jobs = os.environ.get("MAX_JOBS")
    if jobs is None:
        return os.cpu_count() or 1
    if not jobs.isdigit() or int(jobs) < 1:
        raise BuildStop(f"MAX_JOBS must be a positive integer, got {jobs!r}")
    return int(jobs)


def _log(message: str) -> None:
    print(f"vllm_volta: {message}", flush=True)


def _reset_if_stale(build_dir: Path, key: dict[str, str]) -> None:
    """Drop the CMake cache when the interpreter, torch or tools changed since the last
    configure: a cache keeps the old compilers and paths otherwise."""
    key_file = build_dir / "vllm_volta_build_key.json"
    if key_file.exists() and json.loads(key_file.read_text()) != key:
        _log(f"build inputs changed since the last build; reconfiguring {build_dir}")
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
    key_file.write_text(json.dumps(key, indent=1))


def _cmake_args(plan: BuildPlan, ninja: Path) -> list[str]:
    args = [
        "-G", "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={ninja}",
        f"-DPython_EXECUTABLE={plan.python}",
        f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE', 'Release')}",
        f"-DVLLM_VOLTA_FORCE_CPU={'ON' if force_cpu_requested(os.environ) else 'OFF'}",
        # CMake queries the torch again and stops if it does not reach the same decision.
        f"-DVLLM_VOLTA_EXPECT_CUDA={'ON' if plan.cuda else 'OFF'}",
        f"-DVLLM_VOLTA_CUDART={os.environ.get('VLLM_VOLTA_CUDART', 'static')}",
    ]
    if plan.nvcc is not None:
        args.append(f"-DCMAKE_CUDA_COMPILER={plan.nvcc}")
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if cuda_home:
            args.append(f"-DCUDAToolkit_ROOT={cuda_home}")
    return args


class CMakeBuild(build_ext):
    """Plan, configure + build with CMake/ninja, check the library loads, then copy it where
    setuptools wants it."""

    def build_extension(self, ext: Extension) -> None:
        try:
            self._build(ext)
        except BuildStop as stop:
            raise SetupError(f"vllm_volta: {stop}") from None

    def _build(self, ext: Extension) -> None:
        plan = plan_build(python=sys.executable, environ=os.environ, sys_path=sys.path)
        tools = find_build_tools(os.environ, sys.executable)
        (cmake, cmake_version), (ninja, _) = tools["cmake"], tools["ninja"]
        for note in plan.notes:
            _log(note)
        _log(f"cmake {'.'.join(map(str, cmake_version or ()))} at {cmake}, ninja at {ninja}")
        # A fixed folder (not setuptools' per-run temp dir) keeps rebuilds incremental.
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        _reset_if_stale(build_dir, {"python": plan.python, "torch": plan.torch.path,
                                    "torch_version": plan.torch.version, "cmake": str(cmake),
                                    "ninja": str(ninja), "nvcc": str(plan.nvcc)})
        jobs = _num_jobs()
        subprocess.check_call([str(cmake), "-S", str(ROOT), "-B", str(build_dir),
                               *_cmake_args(plan, ninja)], env=plan.env)
        subprocess.check_call([str(cmake), "--build", str(build_dir), "-j", str(jobs)],
                              env=plan.env)

        built = sorted(build_dir.glob("_C*.so"))
        if len(built) != 1:
            raise BuildStop(f"expected exactly one _C*.so in {build_dir}, found {built}")
        # Checked before the copy, so a library that cannot load never replaces a working one.
        check_extension_loads(plan.python, plan.env, built[0])
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], dest)
        _log(f"built {dest.name} ({'CUDA' if plan.cuda else 'CPU-only'}; loads with torch "
             f"{plan.torch.version})")


setup(
    ext_modules=[CMakeExtension("vllm_volta._C")],
    cmdclass={"build_ext": CMakeBuild},
)
