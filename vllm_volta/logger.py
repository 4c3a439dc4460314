"""Logging for vllm_volta: one "vllm_volta" root logger, concise format, log-once helpers.

Every module does ``logger = init_logger(__name__)``. The root logger is configured on the first
call (not at import), with its level taken from ``VLLM_VOLTA_LOGGING_LEVEL``.
"""

from __future__ import annotations

import logging
import sys
import threading

ROOT_LOGGER_NAME = "vllm_volta"
_FORMAT = "%(levelname)s %(asctime)s [%(module)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


class _StdoutHandler(logging.StreamHandler):
    """Writes each record to ``sys.stdout`` as it is then, not as it was when logging was set
    up: a program that diverts stdout (``contextlib.redirect_stdout``, as the benchmarks do to
    keep theirs for one JSON document) diverts these lines too."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:
        pass


_configure_lock = threading.Lock()
_configured = False
_logged_once: set[tuple[str, int, str]] = set()


def configure_root_logger(force: bool = False) -> logging.Logger:
    """Attach the handler to the "vllm_volta" logger and set its level from the environment.

    Runs once per process unless ``force`` is set (used after changing VLLM_VOLTA_LOGGING_LEVEL).
    """
    global _configured
    with _configure_lock:
        root = logging.getLogger(ROOT_LOGGER_NAME)
        if _configured and not force:
            return root
        from vllm_volta import envs  # local: envs itself has no logging dependency

        root.setLevel(envs.VLLM_VOLTA_LOGGING_LEVEL)
        if not any(getattr(h, "_vllm_volta", False) for h in root.handlers):
            handler = _StdoutHandler()
            handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
            handler._vllm_volta = True  # type: ignore[attr-defined]  # marks our own handler
            root.addHandler(handler)
        # Like vLLM: do not duplicate lines through an application's root handler.
        root.propagate = False
        _configured = True
        return root


def init_logger(name: str) -> logging.Logger:
    """Return the logger for module ``name``, placed under the "vllm_volta" root logger."""
    configure_root_logger()
    if name != ROOT_LOGGER_NAME and not name.startswith(ROOT_LOGGER_NAME + "."):
        name = f"{ROOT_LOGGER_NAME}.{name}"
    return logging.getLogger(name)


def log_once(
    logger: logging.Logger, level: int, msg: str, *args: object, stacklevel: int = 1
) -> bool:
    """Log ``msg % args`` at ``level`` only the first time this exact line is seen.

    Returns True when the line was emitted. Lines below the logger's level are not remembered,
    so raising the verbosity later still shows them once. ``stacklevel`` works as in
    ``logging.Logger.log`` (1 = the caller of this function).
    """
    if not logger.isEnabledFor(level):
        return False
    text = msg % args if args else msg
    key = (logger.name, level, text)
    with _configure_lock:
        if key in _logged_once:
            return False
        _logged_once.add(key)
    # +1 so the record names the caller's module and line, not this helper.
    logger.log(level, text, stacklevel=stacklevel + 1)
    return True


def info_once(logger: logging.Logger, msg: str, *args: object) -> bool:
    """``log_once`` at INFO."""
    return log_once(logger, logging.INFO, msg, *args, stacklevel=2)


def warning_once(logger: logging.Logger, msg: str, *args: object) -> bool:
    """``log_once`` at WARNING."""
    return log_once(logger, logging.WARNING, msg, *args, stacklevel=2)


def reset_log_once() -> None:
    """Forget which lines were logged once (for tests)."""
    with _configure_lock:
        _logged_once.clear()
