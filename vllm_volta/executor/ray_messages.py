"""What travels between RayExecutor and its rank actors, besides SchedulerOutput and
ModelRunnerOutput: the start-up message, and the step's grammar masks in place of matchers."""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import torch

from vllm_volta.config import VllmConfig
from vllm_volta.core.scheduler import SchedulerOutput


@dataclass
class WorkerInit:
    """The message that makes an actor rank `rank` of `world_size`."""

    vllm_config: VllmConfig
    rank: int
    world_size: int
    distributed_init_method: str
    cuda_visible_devices: str | None
    local_device: int


class BitmaskRow:
    """Stands in for a request's grammar matcher on rank 0's actor: xgrammar's matchers do not
    pickle, so the engine fills the step's allowed-token row and rank 0 copies it in."""

    def __init__(self, words: torch.Tensor) -> None:
        self.words = words

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        bitmask[index].copy_(self.words)


def with_grammar_rows(out: SchedulerOutput, vocab_size: int) -> SchedulerOutput:
    """`out` with each grammar matcher replaced by this step's bitmask row (read at launch,
    as the model runner would read the matcher in the engine's process); `out` itself when no
    request has a grammar."""
    if not any(s.request.grammar is not None for s in out.scheduled) and not any(
            r.grammar is not None for r in out.errored):
        return out
    from vllm_volta.structured_output import fill_bitmask
    errored = [r if r.grammar is None else _without_grammar(r) for r in out.errored]
    scheduled = []
    for s in out.scheduled:
        if s.request.grammar is not None:
            request = copy.copy(s.request)
            # Only a sampling row reads its mask; the others just drop the matcher.
            request.grammar = (BitmaskRow(fill_bitmask([s.request.grammar], vocab_size)[0])
                               if s.samples else None)
            s = replace(s, request=request)
        scheduled.append(s)
    return replace(out, scheduled=scheduled, errored=errored)


def _without_grammar(request: Any) -> Any:
    request = copy.copy(request)
    request.grammar = None
    return request
