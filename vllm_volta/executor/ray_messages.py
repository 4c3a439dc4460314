"""What travels between RayExecutor and its rank actors, besides SchedulerOutput and
ModelRunnerOutput: the start-up message, rank 0's step (requests as deltas), and the step's
grammar masks in place of matchers."""
from __future__ import annotations

from dataclasses import dataclass
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


def grammar_row(grammar: Any, samples: bool, vocab_size: int) -> BitmaskRow | None:
    """What rank 0 gets for a request's matcher this step: its allowed-token row when the
    request samples (read now, as the model runner would read the matcher in the engine's
    process at launch), else nothing (only sampling rows read a mask)."""
    if grammar is None or not samples:
        return None
    from vllm_volta.structured_output import fill_bitmask
    return BitmaskRow(fill_bitmask([grammar], vocab_size)[0])


@dataclass
class RequestDelta:
    """A request rank 0 already holds: the output tokens sampled since it was last sent, and
    every other attribute that may have changed (counters, status, this step's grammar row)."""

    request_id: str
    new_output_token_ids: list[int]
    state: dict[str, Any]


@dataclass
class DriverStep:
    """Rank 0's step: the schedule, whose requests are whole (first sight) or RequestDelta;
    `reset` drops every request rank 0 holds first (after a failed step: resent whole)."""

    schedule: SchedulerOutput
    reset: bool = False
