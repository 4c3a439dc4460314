"""How many prompt tokens a prefill chunk may take in one step.

Three limits on top of the step's token budget (`max_num_batched_tokens`):

- `long_prefill_token_threshold` (vLLM's knob): a prompt with more tokens left than the
  threshold gets at most that many per step. 0 = no limit (vLLM's default; when
  `max_num_partial_prefills > 1` it becomes 4% of max_model_len, as in vLLM).
- Attention cost cap, beside running decodes only. A chunk of t tokens whose request already
  holds c tokens of context does attention work t * (c + t / 2) (query x key pairs, causal
  within the chunk), which grows with the context while the linear layers' work does not. At
  a 32k context a 256-token chunk costs about twice a decode step on an H200, so decode streams
  sharing the step stall. The cap keeps a chunk's attention work within
  max_num_batched_tokens x `prefill_attention_reference_len` pairs: a full token budget
  attending to that many keys each (1024 by default: about half a 7B decode step's time on an
  H200 with a 2048-token budget). Chunks therefore shrink roughly as 1 / context; the prompt
  still advances at least one token per step, and a prefill with no decodes beside it keeps
  full chunks (nobody waits on its steps). 0 disables the cap.
- `max_num_partial_prefills` / `max_long_partial_prefills` (vLLM's knobs): how many requests
  may end a step partially prefilled, and how many of those may be long (prompt longer than
  the threshold). Prefills that complete in the step do not count, so short prompts still
  batch freely; a prompt held back by these limits lets later waiting prompts go first.
"""
from __future__ import annotations

import math

from vllm_volta.config import SchedulerConfig
from vllm_volta.core.request import Request


def attention_work(num_tokens: int, context: int) -> float:
    """Query x key pairs a chunk of `num_tokens` does after `context` cached tokens."""
    return num_tokens * (context + num_tokens / 2)


def max_tokens_within(work_budget: float, context: int) -> int:
    """The largest t >= 1 with attention_work(t, context) <= work_budget."""
    # t^2 / 2 + c t - W = 0  =>  t = sqrt(c^2 + 2W) - c
    t = int(math.sqrt(context * context + 2.0 * work_budget) - context)
    while t > 0 and attention_work(t, context) > work_budget:  # float rounding
        t -= 1
    return max(1, t)


def is_decoding(request: Request) -> bool:
    """The request's next step runs one token (its pending sampled token included)."""
    return request.num_tokens + request.num_pending - request.num_computed_tokens <= 1


class ChunkPolicy:
    """Per-step chunk limits from the scheduler config (see the module docstring)."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.threshold = config.long_prefill_token_threshold
        self.max_partial = config.max_num_partial_prefills
        self.max_long_partial = config.max_long_partial_prefills
        ref = config.prefill_attention_reference_len
        self.work_budget = float(config.max_num_batched_tokens) * ref if ref > 0 else 0.0

    def describe(self) -> str:
        """One log line: the limits in force and why chunks shrink."""
        cap = (f"beside decodes a chunk's attention work stays <= {self.work_budget:.0f} query-key pairs "
               f"(max_num_batched_tokens x prefill_attention_reference_len), so chunks shrink as the "
               f"context grows" if self.work_budget else "no attention cost cap")
        threshold = (f"at most {self.threshold} tokens a step for prompts longer than that"
                     if self.threshold else "no long_prefill_token_threshold")
        return (f"{cap}; {threshold}; {self.max_partial} partial prefill(s) at once, "
                f"{self.max_long_partial} long")

    def is_long(self, request: Request) -> bool:
        return 0 < self.threshold < request.num_prompt_tokens

    def cap(self, num_new: int, context: int, beside_decodes: bool) -> int:
        """Tokens the chunk may take, <= num_new (already within the step's budget)."""
        if 0 < self.threshold < num_new:
            num_new = self.threshold
        if (beside_decodes and self.work_budget > 0 and num_new > 1
                and attention_work(num_new, context) > self.work_budget):
            num_new = max_tokens_within(self.work_budget, context)
        return num_new


class PartialPrefills:
    """Counts the requests a step leaves partially prefilled (one per step)."""

    __slots__ = ("policy", "num_partial", "num_long")

    def __init__(self, policy: ChunkPolicy) -> None:
        self.policy = policy
        self.num_partial = 0
        self.num_long = 0

    def allows(self, request: Request) -> bool:
        """Whether one more partial prefill of `request` fits the step's limits."""
        if self.num_partial >= self.policy.max_partial:
            return False
        return not self.policy.is_long(request) or self.num_long < self.policy.max_long_partial

    def add(self, request: Request) -> None:
        self.num_partial += 1
        self.num_long += self.policy.is_long(request)
