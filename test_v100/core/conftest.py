from __future__ import annotations

import itertools

import pytest

from vllm_volta.core.request import Request
from vllm_volta.sampling_params import SamplingParams

_ids = itertools.count()


@pytest.fixture
def make_request():
    """Factory for scheduler-level requests with real SamplingParams."""

    def make(prompt, *, block_size=4, max_tokens=8, eos_token_id=None, request_id=None,
             **params):
        sp = SamplingParams(max_tokens=max_tokens, **params)
        sp.update_from_tokenizer(eos_token_id)
        rid = request_id if request_id is not None else f"req-{next(_ids)}"
        return Request(rid, list(prompt), sp, max_tokens=max_tokens, block_size=block_size)

    return make
