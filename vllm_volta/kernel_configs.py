"""Tuned kernel launch configs: JSON files named by op, shape and device, looked up by batch size.

A file such as
``op=paged_attention_decode,head_size=128,num_kv_heads=8,dtype=float16,device_name=NVIDIA_H200.json``
maps batch sizes (string keys) to launch parameters::

    {"1": {"num_splits": 8, "num_warps": 4}, "64": {"num_splits": 1, "num_warps": 8}}

A key may also name a context length, ``"<batch>,<context>"`` (``{"1,4096": {...},
"1,131072": {...}}``), for kernels whose best launch depends on how long the context is (paged
decode); a plain batch key means "any context", so files written before context keys load as
they are.

Files are searched in VLLM_VOLTA_KERNEL_CONFIG_DIR (user-tuned, wins) and then in the shipped
folder ``vllm_volta/kernel_configs/``. The entry for the nearest batch size is used (the smaller
one on a tie); among that batch size's context entries, the nearest context on a log scale (the
smaller on a tie) when the caller gives one. With no matching file the caller's default is returned and one warning names the
file that was looked for. Tuners (benchmarks/kernels/) write files with ``write_kernel_config``.

The W8A8 block-FP8 GEMM keeps vLLM's own file names and launch-param keys
(``N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[..].json``, see the section at the end) so
that files tuned by vLLM's script work unchanged; they are also searched in vLLM's
VLLM_TUNED_CONFIG_FOLDER.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from vllm_volta import envs
from vllm_volta.logger import init_logger, warning_once
from vllm_volta.platforms import get_current_platform

logger = init_logger(__name__)

SHIPPED_CONFIG_DIR = Path(__file__).resolve().parent / "kernel_configs"
_USER_DIR_VAR = "VLLM_VOLTA_KERNEL_CONFIG_DIR"
_NAME_PART = re.compile(r"[A-Za-z0-9_.+-]+")
_UNSAFE_IN_DEVICE_NAME = re.compile(r"[^A-Za-z0-9_.+-]")


def normalize_device_name(name: str) -> str:
    """Device name as it appears in file names: "NVIDIA H100 80GB HBM3" -> "NVIDIA_H100_80GB_HBM3".

    Spaces become underscores (as in vLLM's config files); so does any other character that is
    unsafe in a file name.
    """
    normalized = _UNSAFE_IN_DEVICE_NAME.sub("_", name.strip())
    if not normalized:
        raise ValueError(f"device_name must be a non-empty string; got {name!r}")
    return normalized


def _format_value(key: str, value: Any) -> str:
    text = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else str(value)
    if not _NAME_PART.fullmatch(text):
        raise ValueError(
            f"kernel config field {key}={value!r} must be letters, digits or _.+- only"
        )
    return text


def kernel_config_file_name(op: str, *, device_name: str, **shape: Any) -> str:
    """``op=<op>,<key>=<value>,...,device_name=<normalized name>.json``, shape keys in call order.

    torch dtypes are written without the "torch." prefix (dtype=float16).
    """
    parts = [f"op={_format_value('op', op)}"]
    for key, value in shape.items():
        if not key.isidentifier():
            raise ValueError(f"kernel config shape field {key!r} must be an identifier")
        parts.append(f"{key}={_format_value(key, value)}")
    parts.append(f"device_name={normalize_device_name(device_name)}")
    return ",".join(parts) + ".json"


EntryKey = tuple[int, int | None]  # (batch size, context length or None = any context)


@dataclass(frozen=True)
class _ConfigTable:
    """One parsed file: sorted batch sizes, each with its context-free entry and context entries.

    ``configs[i]`` is batch ``batch_sizes[i]``'s entry when no context is asked for: its
    any-context entry, else its shortest context's. ``by_context[i]`` holds (context, params)
    pairs sorted by context (empty for files without context keys).
    """

    path: Path
    batch_sizes: tuple[int, ...]
    configs: tuple[dict[str, Any], ...]
    by_context: tuple[tuple[tuple[int, dict[str, Any]], ...], ...] = ()

    def _nearest_batch(self, batch_size: int) -> int:
        i = bisect.bisect_left(self.batch_sizes, batch_size)
        if i == len(self.batch_sizes):
            return i - 1
        if i > 0 and batch_size - self.batch_sizes[i - 1] <= self.batch_sizes[i] - batch_size:
            return i - 1
        return i

    def nearest(self, batch_size: int, context_len: int | None = None) -> dict[str, Any]:
        i = self._nearest_batch(batch_size)
        contexts = self.by_context[i] if self.by_context else ()
        if context_len is None or not contexts:
            return self.configs[i]
        # Log scale (24k is nearer 32k than 16k), by the exact ratio so that a context at the
        # geometric midpoint ties; the smaller context wins a tie.
        return min(contexts, key=lambda e: (Fraction(max(e[0], context_len), min(e[0], context_len)), e[0]))[1]

    @classmethod
    def from_entries(cls, path: Path, entries: list[tuple[EntryKey, dict[str, Any]]]) -> _ConfigTable:
        """Build from validated entries sorted by (batch, context; any-context first)."""
        batches: dict[int, list[tuple[int | None, dict[str, Any]]]] = {}
        for (batch, context), params in entries:
            batches.setdefault(batch, []).append((context, params))
        sizes = tuple(sorted(batches))
        configs = tuple(batches[b][0][1] for b in sizes)  # any-context sorts first
        by_context = tuple(tuple((c, p) for c, p in batches[b] if c is not None) for b in sizes)
        return cls(path, sizes, configs, by_context if any(by_context) else ())


def _parse_positive(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        return 0
    return value if str(value) == text.strip() else 0


def _parse_key(key: Any, where: str) -> EntryKey:
    """``"8"`` / ``8`` / ``(8, None)`` -> (8, None); ``"8,4096"`` / ``(8, 4096)`` -> (8, 4096)."""
    if isinstance(key, tuple) and len(key) == 2:
        items = key if key[1] is not None else key[:1]
        parts = [str(k) if isinstance(k, int) and not isinstance(k, bool) else "" for k in items]
    elif isinstance(key, bool) or not isinstance(key, (int, str)):
        parts = [""]
    else:
        parts = str(key).split(",")
    values = [_parse_positive(part) for part in parts]
    if len(values) > 2 or min(values) < 1:
        raise ValueError(f"{where}: batch size keys must be positive integers, or \"<batch>,<context>\" "
                         f"with a positive context length; got {key!r}")
    return (values[0], values[1] if len(values) == 2 else None)


def _validated_entries(data: Any, where: str) -> list[tuple[EntryKey, dict[str, Any]]]:
    """Check a {key: {param: value}} mapping; returns entries sorted by (batch, context), the
    any-context entry of a batch size first."""
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{where}: expected a non-empty mapping of batch size -> launch params")
    entries = []
    for key, params in data.items():
        if not isinstance(params, Mapping):
            raise ValueError(f"{where}: entry {key!r} must be a mapping of launch params")
        entries.append((_parse_key(key, where), dict(params)))
    entries.sort(key=lambda e: (e[0][0], e[0][1] or 0))
    keys = [k for k, _ in entries]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: duplicate keys {[_key_text(k) for k in keys]}")
    return entries


def _key_text(key: EntryKey) -> str:
    return str(key[0]) if key[1] is None else f"{key[0]},{key[1]}"


def _search_dirs(user_dir: str | None) -> list[Path]:
    return ([Path(user_dir)] if user_dir else []) + [SHIPPED_CONFIG_DIR]


@lru_cache(maxsize=None)
def _find_table(file_name: str, user_dir: str | None) -> _ConfigTable | None:
    return _find_in_dirs(file_name, tuple(_search_dirs(user_dir)))


@lru_cache(maxsize=None)
def _find_in_dirs(file_name: str, dirs: tuple[Path, ...]) -> _ConfigTable | None:
    """The first folder's file of that name, parsed; None when no folder has it."""
    for folder in dirs:
        path = folder / file_name
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"kernel config {path} is not valid JSON: {e}") from e
            return _ConfigTable.from_entries(path, _validated_entries(data, f"kernel config {path}"))
    return None


def _default_device_name() -> str:
    return get_current_platform().get_device_name()


def load_kernel_config_table(
    op: str, *, device_name: str | None = None, **shape: Any
) -> dict[int, dict[str, Any]] | None:
    """The tuned table for (op, shape, device) as {batch size: params}, or None (a file with
    context keys: each batch size's any-context entry, else its shortest context's)."""
    file_name = kernel_config_file_name(op, device_name=device_name or _default_device_name(), **shape)
    table = _find_table(file_name, envs.get(_USER_DIR_VAR))
    if table is None:
        return None
    return {size: dict(cfg) for size, cfg in zip(table.batch_sizes, table.configs)}


def load_kernel_config_entries(
    op: str, *, device_name: str | None = None, **shape: Any
) -> dict[EntryKey, dict[str, Any]] | None:
    """Every entry of the tuned table as {(batch size, context or None): params}, or None."""
    file_name = kernel_config_file_name(op, device_name=device_name or _default_device_name(), **shape)
    table = _find_table(file_name, envs.get(_USER_DIR_VAR))
    if table is None:
        return None
    out: dict[EntryKey, dict[str, Any]] = {}
    for i, size in enumerate(table.batch_sizes):
        contexts = table.by_context[i] if table.by_context else ()
        if not contexts or table.configs[i] is not contexts[0][1]:  # an any-context entry
            out[(size, None)] = dict(table.configs[i])
        out.update({(size, c): dict(p) for c, p in contexts})
    return out


def get_kernel_config(
    op: str,
    batch_size: int,
    *,
    default: Mapping[str, Any],
    device_name: str | None = None,
    context_len: int | None = None,
    **shape: Any,
) -> dict[str, Any]:
    """Launch params for ``op`` at ``batch_size`` (nearest tuned entry), or a copy of ``default``.

    ``context_len`` picks among the nearest batch size's context entries (nearest on a log
    scale); tables without context keys ignore it. ``device_name`` defaults to the current
    device's name. Lookups are cached (this sits in hot paths); callers that pass a context
    should bucket it, and call ``clear_kernel_config_cache()`` after editing files outside
    ``write_kernel_config``.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    if context_len is not None and (not isinstance(context_len, int) or isinstance(context_len, bool)
                                    or context_len < 1):
        raise ValueError(f"context_len must be a positive integer or None; got {context_len!r}")
    found = _cached_lookup(
        op, batch_size, device_name or _default_device_name(), tuple(shape.items()),
        envs.raw(_USER_DIR_VAR), context_len,
    )
    return dict(default if found is None else found)


@lru_cache(maxsize=4096)
def _cached_lookup(
    op: str,
    batch_size: int,
    device_name: str,
    shape_items: tuple[tuple[str, Any], ...],
    user_dir_text: str | None,
    context_len: int | None = None,
) -> dict[str, Any] | None:
    file_name = kernel_config_file_name(op, device_name=device_name, **dict(shape_items))
    user_dir = envs.ENV_VARS[_USER_DIR_VAR].parse(user_dir_text)
    table = _find_table(file_name, user_dir)
    if table is None:
        searched = ", ".join(str(d) for d in _search_dirs(user_dir))
        warning_once(
            logger,
            "No tuned kernel config %s (searched %s); using the default config for %s "
            "(a tuner in benchmarks/kernels/ writes one: README_v100.md section 4)",
            file_name, searched, op,
        )
        return None
    return table.nearest(batch_size, context_len)


def write_kernel_config(
    op: str,
    configs: Mapping[Any, Mapping[str, Any]],
    *,
    device_name: str | None = None,
    directory: str | os.PathLike[str] | None = None,
    **shape: Any,
) -> Path:
    """Write a tuned table (batch size, or (batch size, context length), -> launch params) and
    return the file's path.

    ``directory`` defaults to VLLM_VOLTA_KERNEL_CONFIG_DIR when set, else the shipped folder.
    The write is atomic (temporary file + rename) and clears the lookup cache.
    """
    file_name = kernel_config_file_name(op, device_name=device_name or _default_device_name(), **shape)
    entries = _validated_entries(configs, f"configs for {file_name}")
    if directory is None:
        directory = envs.get(_USER_DIR_VAR) or SHIPPED_CONFIG_DIR
    return _write_table(Path(directory), file_name, entries)


def _write_table(folder: Path, file_name: str, entries: list[tuple[EntryKey, dict[str, Any]]]) -> Path:
    """Atomic write (temporary file + rename) of a validated table; clears the lookup cache."""
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({_key_text(key): params for key, params in entries}, indent=4) + "\n"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; configs are meant to be shared
        path = folder / file_name
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    clear_kernel_config_cache()
    logger.info("Wrote kernel config %s", path)
    return path


def clear_kernel_config_cache() -> None:
    """Forget parsed files (call after editing config files by hand)."""
    _cached_lookup.cache_clear()
    _find_table.cache_clear()
    _find_in_dirs.cache_clear()
    _w8a8_lookup.cache_clear()


# --- vLLM's W8A8 block-FP8 GEMM configs, under vLLM's own file names ------------------------------
# ``N={N},K={K},device_name={name},dtype=fp8_w8a8,block_shape=[{bn},{bk}].json`` as written by
# vLLM's benchmark_w8a8_block_fp8.py (and ours): batch size -> Triton launch params. Folders:
# VLLM_VOLTA_KERNEL_CONFIG_DIR, then vLLM's VLLM_TUNED_CONFIG_FOLDER, then the shipped folder, so a
# file tuned by vLLM drops in unchanged.

W8A8_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
_VLLM_USER_DIR_VAR = "VLLM_TUNED_CONFIG_FOLDER"


def w8a8_block_fp8_file_name(n: int, k: int, block_shape: tuple[int, int] | list[int], *,
                             device_name: str) -> str:
    """vLLM's file name for the W8A8 block-FP8 GEMM of weight [N, K] with ``block_shape`` [bn, bk]."""
    for field, value in (("N", n), ("K", k), ("block_n", block_shape[0]), ("block_k", block_shape[1])):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive integer; got {value!r}")
    return (f"N={n},K={k},device_name={normalize_device_name(device_name)},"
            f"dtype=fp8_w8a8,block_shape=[{block_shape[0]},{block_shape[1]}].json")


def default_w8a8_block_fp8_config(block_shape: tuple[int, int] | list[int]) -> dict[str, int]:
    """The launch params used without a tuned file (vLLM's default for this kernel)."""
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block_shape[0], "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 2}


def _w8a8_dirs(ours: str | None, vllms: str | None) -> tuple[Path, ...]:
    return tuple(Path(d) for d in (ours, vllms) if d) + (SHIPPED_CONFIG_DIR,)


def _check_w8a8_table(table: _ConfigTable, block_k: int) -> None:
    if table.by_context:
        raise ValueError(f"kernel config {table.path}: vLLM's W8A8 files are keyed by batch size only")
    for size, cfg in zip(table.batch_sizes, table.configs):
        missing = [key for key in W8A8_CONFIG_KEYS if key not in cfg]
        bad = [key for key in W8A8_CONFIG_KEYS if key in cfg and
               (not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < 1)]
        if missing or bad:
            raise ValueError(f"kernel config {table.path}, batch size {size}: needs positive integers "
                             f"{', '.join(W8A8_CONFIG_KEYS)}; missing {missing}, invalid {bad}")
        if block_k % cfg["BLOCK_SIZE_K"]:
            raise ValueError(f"kernel config {table.path}, batch size {size}: BLOCK_SIZE_K="
                             f"{cfg['BLOCK_SIZE_K']} must divide the quantization block's {block_k}")


@lru_cache(maxsize=1024)
def _w8a8_lookup(n: int, k: int, block_shape: tuple[int, int], device_name: str,
                 ours_text: str | None, vllms_text: str | None) -> _ConfigTable | None:
    file_name = w8a8_block_fp8_file_name(n, k, block_shape, device_name=device_name)
    dirs = _w8a8_dirs(envs.ENV_VARS[_USER_DIR_VAR].parse(ours_text),
                      envs.ENV_VARS[_VLLM_USER_DIR_VAR].parse(vllms_text))
    table = _find_in_dirs(file_name, dirs)
    if table is None:
        warning_once(logger, "Using default W8A8 Block FP8 kernel config. Performance might be "
                     "sub-optimal! Config file not found at %s (searched %s; "
                     "benchmarks/kernels/benchmark_w8a8_block_fp8.py --tune writes one)",
                     file_name, ", ".join(str(d) for d in dirs))
        return None
    _check_w8a8_table(table, block_shape[1])
    return table


def get_w8a8_block_fp8_configs(n: int, k: int, block_shape: tuple[int, int] | list[int], *,
                               device_name: str | None = None) -> dict[int, dict[str, Any]] | None:
    """The tuned table {batch size: launch params} for weight [N, K], or None (one warning)."""
    table = _w8a8_lookup(n, k, tuple(block_shape), normalize_device_name(device_name or _default_device_name()),
                         envs.raw(_USER_DIR_VAR), envs.raw(_VLLM_USER_DIR_VAR))
    if table is None:
        return None
    return {size: dict(cfg) for size, cfg in zip(table.batch_sizes, table.configs)}


def get_w8a8_block_fp8_config(m: int, n: int, k: int, block_shape: tuple[int, int] | list[int], *,
                              device_name: str | None = None) -> dict[str, Any]:
    """Launch params for M rows: the tuned entry of the nearest batch size (the smaller on a tie),
    else the default config."""
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"M (batch rows) must be a positive integer; got {m!r}")
    table = _w8a8_lookup(n, k, tuple(block_shape), normalize_device_name(device_name or _default_device_name()),
                         envs.raw(_USER_DIR_VAR), envs.raw(_VLLM_USER_DIR_VAR))
    return dict(default_w8a8_block_fp8_config(block_shape) if table is None else table.nearest(m))


def write_w8a8_block_fp8_configs(configs: Mapping[int, Mapping[str, Any]], n: int, k: int,
                                 block_shape: tuple[int, int] | list[int], *, device_name: str | None = None,
                                 directory: str | os.PathLike[str] | None = None) -> Path:
    """Write a tuned table under vLLM's file name (atomic) and return its path. ``directory``
    defaults to VLLM_VOLTA_KERNEL_CONFIG_DIR, then VLLM_TUNED_CONFIG_FOLDER, then the shipped folder."""
    file_name = w8a8_block_fp8_file_name(n, k, block_shape, device_name=device_name or _default_device_name())
    entries = _validated_entries(configs, f"configs for {file_name}")
    table = _ConfigTable.from_entries(Path(file_name), entries)
    _check_w8a8_table(table, block_shape[1])
    folder = directory or envs.get(_USER_DIR_VAR) or envs.get(_VLLM_USER_DIR_VAR) or SHIPPED_CONFIG_DIR
    return _write_table(Path(folder), file_name, entries)
