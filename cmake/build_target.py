"""Which torch vllm_volta._C is built against, and whether the build is a CUDA one.

The extension must load with the torch that will run it: the one installed for the target
interpreter, ``sys.executable`` (pip runs the build backend with the interpreter it installs
into). Under pip's build isolation that interpreter sees a temporary environment instead
(PYTHONPATH points at pip's overlay, whose sitecustomize hides the real site-packages); a torch
found there would be a second, downloaded one (typically a CUDA wheel while the target has a
CPU-only torch: a build that links libtorch_cuda.so and then fails at import). So the torch is
always probed in a subprocess with pip's overlay removed, and torch is not a build requirement.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from build_tools import BuildStop, find_nvcc, nvcc_version

MIN_TORCH = (2, 11)
# What pip's build isolation sets on top of the user's environment.
ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE")
INSTALL_STEPS = ("pip install -r requirements-build.txt && pip install --no-build-isolation -e .")
TORCH_FIRST = ("install torch first (CPU: pip install torch; V100, CUDA 12.6: "
               "pip install -r requirements-cu126.txt)")

_PROBE = r"""
import importlib.util, json, os, site, sysconfig
sites = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
sites += [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
info = {"site_packages": sorted({os.path.realpath(p) for p in sites if os.path.isdir(p)}),
        "torch": None}
if importlib.util.find_spec("torch") is not None:
    import torch
    info["torch"] = {"version": torch.__version__, "path": os.path.dirname(torch.__file__),
                     "cuda": torch.version.cuda}
print(json.dumps(info))
"""


@dataclass(frozen=True)
class TorchInfo:
    """A torch installation as the target interpreter imports it."""

    version: str
    path: str
    cuda: str | None  # torch.version.cuda: "12.6", or None for a CPU-only torch

    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.version.split("+")[0].split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@dataclass
class BuildPlan:
    """What the build will do, and the log lines that say why."""

    python: str
    env: dict[str, str]  # environment for cmake: the target's view, pip's overlay removed
    torch: TorchInfo
    isolated: bool
    cuda: bool
    nvcc: Path | None = None
    notes: list[str] = field(default_factory=list)


def without_isolation(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with pip's build-isolation overlay taken out."""
    return {k: v for k, v in environ.items() if k not in ISOLATION_VARS}


def probe_interpreter(python: str, environ: Mapping[str, str]) -> dict:
    """site-packages dirs and torch (version, path, CUDA) as ``python`` sees them."""
    proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                          env=dict(environ), timeout=300)
    if proc.returncode != 0:
        raise BuildStop(f"could not probe {python} for torch: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def is_isolated(target_site_packages: list[str], sys_path: list[str]) -> bool:
    """True when this process cannot see the target interpreter's site-packages (pip's
    isolation removes them from sys.path)."""
    visible = {os.path.realpath(p) for p in sys_path if p}
    return any(p not in visible for p in target_site_packages)


def check_torch(torch: TorchInfo | None, python: str) -> TorchInfo:
    """Stop unless the target has a torch the stable ABI supports (>= 2.11)."""
    if torch is None:
        raise BuildStop(
            f"the extension is built against the torch that will run it, and {python} has none: "
            f"{TORCH_FIRST}, then: {INSTALL_STEPS}")
    if torch.version_tuple() < MIN_TORCH:
        raise BuildStop(
            f"torch {torch.version} at {torch.path} is older than 2.11 (the stable ABI this "
            f"extension targets): pip install 'torch>=2.11' (V100: pip install -r "
            f"requirements-cu126.txt), then: {INSTALL_STEPS}")
    return torch


def decide_cuda(torch: TorchInfo, *, force_cpu: bool, nvcc: Path | None, nvcc_where: str,
                nvcc_release: tuple[int, int] | None, cudart: str) -> tuple[bool, list[str]]:
    """CUDA or CPU-only build for this torch and toolkit, and the reasons; BuildStop where
    no working CUDA build is possible."""
    if force_cpu:
        return False, ["VLLM_VOLTA_FORCE_CPU=1: building the CPU kernels only"]
    if torch.cuda is None:
        unused = f" (nvcc at {nvcc} is not used)" if nvcc else ""
        return False, [f"torch {torch.version} is CPU-only: building the CPU kernels only{unused}"]
    cpu_route = "or build the CPU kernels only: VLLM_VOLTA_FORCE_CPU=1 " + INSTALL_STEPS.split(" && ")[1]
    major = torch.cuda.split(".")[0]
    if nvcc is None:
        raise BuildStop(
            f"torch {torch.version} is built for CUDA {torch.cuda}, but nvcc was {nvcc_where}: "
            f"install a CUDA {major}.x toolkit and set CUDA_HOME=/path/to/cuda-{torch.cuda}, "
            f"{cpu_route}")
    if nvcc_release is None:
        raise BuildStop(f"nvcc at {nvcc} (from {nvcc_where}) did not report its release "
                        f"(`nvcc --version`): set CUDA_HOME to a CUDA {major}.x toolkit, {cpu_route}")
    notes = [f"torch {torch.version} has CUDA {torch.cuda}: building CUDA kernels with nvcc "
             f"{nvcc_release[0]}.{nvcc_release[1]} at {nvcc} (from {nvcc_where})"]
    if str(nvcc_release[0]) != major:
        if cudart == "shared":
            raise BuildStop(
                f"nvcc {nvcc_release[0]}.{nvcc_release[1]} at {nvcc} and torch's CUDA "
                f"{torch.cuda} differ in major version, and VLLM_VOLTA_CUDART=shared links the "
                f"toolkit's libcudart: set CUDA_HOME to a CUDA {major}.x toolkit, or use "
                "VLLM_VOLTA_CUDART=static")
        notes.append(f"nvcc's CUDA {nvcc_release[0]} differs from torch's {torch.cuda}; the "
                     "CUDA runtime is linked statically, so the driver must support both")
    return True, notes


def force_cpu_requested(environ: Mapping[str, str]) -> bool:
    """VLLM_VOLTA_FORCE_CPU as a switch (1/true/yes/on), as vllm_volta.envs reads it."""
    return environ.get("VLLM_VOLTA_FORCE_CPU", "").lower() in ("1", "true", "yes", "on")


def plan_build(*, python: str, environ: Mapping[str, str], sys_path: list[str],
               probe: Callable[[str, Mapping[str, str]], dict] = probe_interpreter,
               release_of: Callable[[Path], tuple[int, int] | None] = nvcc_version) -> BuildPlan:
    """Decide the build for the target interpreter: its torch, CPU or CUDA, which nvcc."""
    env = without_isolation(environ)
    info = probe(python, env)
    isolated = is_isolated(info["site_packages"], sys_path)
    if not isolated:
        env = dict(environ)  # the user's own PYTHONPATH, if any, is part of the target's view
    torch = check_torch(TorchInfo(**info["torch"]) if info["torch"] else None, python)
    notes = [f"building against torch {torch.version} at {torch.path} (the torch of {python})"]
    if isolated:
        notes.append("pip's build isolation is on: its temporary environment is used for the "
                     "build tools only; torch is the one of the environment being installed into")
    force_cpu = force_cpu_requested(environ)
    nvcc, where = None, "not looked up"
    if not force_cpu:
        try:
            nvcc, where = find_nvcc(environ)
        except BuildStop:
            if torch.cuda is not None:  # a bad CUDA_HOME only matters to a CUDA build
                raise
    release = release_of(nvcc) if (nvcc is not None and torch.cuda and not force_cpu) else None
    cuda, why = decide_cuda(torch, force_cpu=force_cpu, nvcc=nvcc, nvcc_where=where,
                            nvcc_release=release,
                            cudart=environ.get("VLLM_VOLTA_CUDART", "static"))
    return BuildPlan(python=python, env=env, torch=torch, isolated=isolated, cuda=cuda,
                     nvcc=nvcc if cuda else None, notes=notes + why)


def check_extension_loads(python: str, env: Mapping[str, str], library: Path) -> None:
    """Load the built library with the target's torch; BuildStop (no broken install) if not."""
    code = "import sys, torch; torch.ops.load_library(sys.argv[1])"
    proc = subprocess.run([python, "-c", code, str(library)], capture_output=True, text=True,
                          env=dict(env), timeout=300)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise BuildStop(f"the built {library.name} does not load with the torch of {python}: "
                        f"{tail[0]}. Rebuild with: {INSTALL_STEPS}")
