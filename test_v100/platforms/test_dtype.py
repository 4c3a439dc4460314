"""parse_dtype: vLLM's dtype spellings."""

from __future__ import annotations

import pytest
import torch

from vllm_volta.platforms.dtype import dtype_name, parse_dtype


@pytest.mark.parametrize("text,expected", [
    ("auto", None), ("AUTO", None), ("half", torch.float16), ("float16", torch.float16),
    ("bfloat16", torch.bfloat16), ("float", torch.float32), ("float32", torch.float32),
    (" Half ", torch.float16), (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
])
def test_parse(text, expected):
    assert parse_dtype(text) == expected


@pytest.mark.parametrize("bad", ["fp16", "float64", "double", "int8", "", None, 1, torch.float64,
                                 torch.int32])
def test_parse_rejects(bad):
    with pytest.raises(ValueError) as info:
        parse_dtype(bad)
    msg = str(info.value)
    assert msg.startswith("dtype must be one of")
    for allowed in ("'auto'", "'half'", "'float16'", "'bfloat16'", "'float'", "'float32'",
                    "torch.float16"):
        assert allowed in msg
    assert repr(bad) in msg


def test_dtype_name():
    assert [dtype_name(d) for d in (torch.float16, torch.bfloat16, torch.float32)] == [
        "float16", "bfloat16", "float32"]
