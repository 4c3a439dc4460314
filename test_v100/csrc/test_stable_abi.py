"""csrc/ uses the libtorch stable ABI only: no legacy ATen / C++-API headers anywhere."""

from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc"
LEGACY = ("torch/all.h", "ATen/ATen.h", "torch/extension.h", "torch/library.h", "torch/torch.h",
          "torch/python.h", "c10/cuda/CUDAStream.h", "ATen/cuda/CUDAContext.h")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def torch_includes() -> dict[Path, list[str]]:
    found = {}
    for path in CSRC.rglob("*"):
        if path.suffix in {".h", ".cuh", ".cpp", ".cu"}:
            found[path] = [inc for inc in INCLUDE.findall(path.read_text()) if inc.split("/")[0] in {"torch", "ATen", "c10"}]
    return found


def test_csrc_has_sources():
    assert len(torch_includes()) >= 8


def test_no_legacy_torch_headers_in_csrc():
    offenders = {str(p.relative_to(CSRC)): incs for p, incs in torch_includes().items() if set(incs) & set(LEGACY)}
    assert offenders == {}


def test_torch_includes_are_stable_abi_only():
    allowed = ("torch/csrc/stable/", "torch/headeronly/")
    offenders = {str(p.relative_to(CSRC)): [i for i in incs if not i.startswith(allowed)]
                 for p, incs in torch_includes().items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_libstdcxx_is_the_shared_one():
    """No static libstdc++ copy in the module: its private iostream/locale state crashed
    error-message formatting on a GPU image (CMakeLists.txt links -lstdc++ explicitly)."""
    import shutil
    import subprocess

    import vllm_volta._C as ext

    nm = shutil.which("nm")
    assert nm is not None, "this check needs binutils' nm (apt install binutils)"
    defined = subprocess.run([nm, "-C", "--defined-only", ext.__file__], capture_output=True, text=True,
                             check=True).stdout
    leaked = [line for line in defined.splitlines() if re.search(r"std::(basic_ostream|locale::|ios_base::)", line)]
    assert leaked == [], leaked[:5]
