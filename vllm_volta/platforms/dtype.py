"""Parsing of the user's ``dtype`` argument (vLLM's spellings) into a torch dtype."""

from __future__ import annotations

import torch

# vLLM's accepted strings; "auto" is handled by the platform (it depends on the device).
STR_TO_DTYPE: dict[str, torch.dtype] = {
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}
ALLOWED_DTYPE_STRINGS = ("auto", *STR_TO_DTYPE)
_ALLOWED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(requested: str | torch.dtype) -> torch.dtype | None:
    """Map a user dtype to a torch dtype; ``"auto"`` -> None (the platform decides).

    Raises ValueError naming ``dtype`` and every allowed value for anything else.
    """
    if isinstance(requested, torch.dtype):
        if requested in _ALLOWED_TORCH_DTYPES:
            return requested
    elif isinstance(requested, str):
        key = requested.strip().lower()
        if key == "auto":
            return None
        if key in STR_TO_DTYPE:
            return STR_TO_DTYPE[key]
    allowed = ", ".join(repr(s) for s in ALLOWED_DTYPE_STRINGS)
    allowed_torch = ", ".join(str(d) for d in _ALLOWED_TORCH_DTYPES)
    raise ValueError(f"dtype must be one of {allowed} or {allowed_torch}; got {requested!r}")
