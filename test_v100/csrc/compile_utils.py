"""Compile-only helpers for test_compile.py: find nvcc / NVRTC and run them (no GPU needed)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
TORCH_TARGET_VERSION = "0x020b000000000000"


def find_cuda_home() -> Path | None:
    """$CUDA_HOME, else the machine's CUDA 13 install, else the nvcc on PATH."""
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda-13.0", "/usr/local/cuda"]
    nvcc_on_path = shutil.which("nvcc")
    if nvcc_on_path:
        candidates.append(str(Path(nvcc_on_path).resolve().parents[1]))
    for c in candidates:
        if c and (Path(c) / "bin" / "nvcc").exists():
            return Path(c)
    return None


def nvcc_compile(cu_file: Path, sm: str, *, adapter: bool, torch_include: str, out_dir: Path) -> subprocess.CompletedProcess:
    """nvcc -c (SASS for sm_<sm>) with the build's defines; returns the finished process."""
    cuda_home = find_cuda_home()
    cmd = [str(cuda_home / "bin" / "nvcc"), "-std=c++17", "-O3", "-c", str(cu_file),
           f"-I{CSRC}", f"-I{torch_include}", "-DUSE_CUDA", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}",
           f"-gencode=arch=compute_{sm},code=sm_{sm}", "-o", str(out_dir / f"{cu_file.stem}.sm{sm}.o")]
    if adapter:
        cmd.append("-DVLLM_V100_ADAPTER")
    return subprocess.run(cmd, capture_output=True, text=True)


def load_nvrtc_12() -> ctypes.CDLL | None:
    """libnvrtc from the pip package nvidia-cuda-nvrtc-cu12 (12.x still targets compute_70)."""
    try:
        import nvidia.cuda_nvrtc as pkg
    except ImportError:
        return None
    for root in pkg.__path__:
        lib = Path(root) / "lib" / "libnvrtc.so.12"
        if lib.exists():
            return ctypes.CDLL(str(lib))
    return None


def nvrtc_compile(lib: ctypes.CDLL, source: str, name_expressions: list[str], arch: str,
                  include_dirs: list[Path]) -> tuple[int, str, str]:
    """Compile `source` to PTX for `arch`, instantiating each template name expression.
    Returns (nvrtcResult, log, ptx)."""
    prog = ctypes.c_void_p()
    lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"nvrtc_check.cu", 0, None, None)
    for expr in name_expressions:
        lib.nvrtcAddNameExpression(prog, expr.encode())
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"] + [f"-I{d}".encode() for d in include_dirs]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = b""
    if rc == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, buf)
        ptx = buf.value
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace"), ptx.decode(errors="replace")


def nvrtc_version(lib: ctypes.CDLL) -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value
