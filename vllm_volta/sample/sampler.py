"""Sampler: [B, V] logits + SamplingMetadata -> next token per row (and logprobs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vllm_volta import _custom_ops as ops
from vllm_volta.sample.filters import apply_min_p, apply_top_k_top_p
from vllm_volta.sample.logprobs import LogprobsTensors, gather_logprobs
from vllm_volta.sample.metadata import SamplingMetadata
from vllm_volta.sample.penalties import apply_min_tokens, apply_penalties
from vllm_volta.sample.token_bias import apply_allowed_token_ids, apply_bitmask, apply_logit_bias


@dataclass
class SamplerOutput:
    """sampled_token_ids [B] int64; logprobs_tensors (None unless a row asked for
    logprobs) holds the sampled token, the batch's max top-k and the sampled token's rank,
    all from the raw logits' log-softmax (vLLM's default "raw_logprobs"). sampled_host is the
    caller's pinned `sampled_host` when the sampling kernel wrote the ids into it as well
    (valid once the stream has run the kernel), else None."""

    sampled_token_ids: torch.Tensor
    logprobs_tensors: LogprobsTensors | None = None
    sampled_host: torch.Tensor | None = None


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Draw one token per row from `probs` with the exponential race argmax(p / q), q ~ Exp(1).

    Seeded rows draw their q from their own generator, so their samples do not depend on
    which other rows share the batch or in which order.
    """
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    # q == 0 would turn a masked p == 0 into NaN, which argmax would pick.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return probs.div_(q).argmax(dim=1)


def greedy_kernel_applies(logits: torch.Tensor) -> bool:
    return logits.is_cuda and ops.has_cuda_kernel("greedy_sample")


def greedy_sample(logits: torch.Tensor, sampled_host: torch.Tensor | None = None) -> torch.Tensor:
    """argmax of each row: the ``greedy_sample`` kernel for CUDA logits (one pass spread over
    many blocks: ATen's argmax reduces a 128k-entry row in one block, ~36 us on an H200),
    else ``torch.argmax``. Both take the lowest index among equal maxima. The kernel also
    writes the ids into ``sampled_host`` (pinned) when given."""
    if not greedy_kernel_applies(logits):
        return logits.argmax(dim=1)
    sampled = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    ops.greedy_sample(sampled, logits, sampled_host=sampled_host)
    return sampled


def fused_sampling_applies(logits: torch.Tensor, metadata: SamplingMetadata) -> bool:
    """Whether the random rows can use ``gumbel_sample``: CUDA logits and no top-k, top-p or
    min-p (those filters need the sorted or normalized probabilities)."""
    return (logits.is_cuda and metadata.no_top_k and metadata.no_top_p and metadata.no_min_p
            and ops.has_cuda_kernel("gumbel_sample"))


class NoiseSeeds:
    """Per-row Philox keys for ``gumbel_sample`` without a device launch per step.

    Unseeded rows use fixed 64-bit keys (drawn once from the default generator of the logits'
    device, one per row position) at a counter offset that advances every call, so no two calls
    share noise. A batch with seeded rows draws fresh keys per call (offset 0): the seeded rows'
    from their own generators, so their samples do not depend on the batch around them.
    """

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._calls = 0

    def __call__(self, rows: int, device: torch.device,
                 generators: dict[int, torch.Generator]) -> tuple[torch.Tensor, int]:
        if generators:
            seeds = torch.empty(rows, dtype=torch.int64, device=device).random_()
            for row, generator in generators.items():
                seeds[row] = torch.empty(1, dtype=torch.int64,
                                         device=generator.device).random_(generator=generator)[0]
            return seeds, 0
        if self._keys is None or self._keys.device != device or self._keys.numel() < rows:
            self._keys = torch.empty(max(rows, 256), dtype=torch.int64, device=device).random_()
        self._calls += 1
        return self._keys[:rows], self._calls


def fused_random_sample(logits: torch.Tensor, temperature: torch.Tensor,
                        generators: dict[int, torch.Generator], noise_seeds: NoiseSeeds,
                        sampled_host: torch.Tensor | None = None) -> torch.Tensor:
    """The exponential race of ``random_sample`` in one kernel (the Gumbel-max form) over the
    raw logits: no float32 copy, softmax or noise tensor. Each row's noise comes from its
    Philox key and the call's offset (``NoiseSeeds``). The kernel also writes the ids into
    ``sampled_host`` (pinned) when given."""
    rows = logits.shape[0]
    seeds, offset = noise_seeds(rows, logits.device, generators)
    sampled = torch.empty(rows, dtype=torch.int64, device=logits.device)
    ops.gumbel_sample(sampled, logits, temperature, seeds, seed_offset=offset, sampled_host=sampled_host)
    return sampled


class Sampler(nn.Module):
    """vLLM's sampling pipeline.

    Order: structured-output grammar masks, allowed_token_ids, min_tokens masking of stop/eos
    ids, logit_bias, penalties (repetition on prompt + output, presence/frequency on output),
    greedy argmax for temperature-0 rows; for the others temperature, top-k, top-p, min-p, then
    an exponential-race sample (on CUDA without top-k/top-p/min-p: the same race fused into one
    pass, ``fused_random_sample``).

    With ``sampled_host`` (pinned, one int64 per row) the ids are written there by the sampling
    kernel itself where one kernel makes them (all rows greedy, or all random on the fused
    path); the output says whether it did.
    """

    def __init__(self) -> None:
        super().__init__()
        self.noise_seeds = NoiseSeeds()

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata,
                sampled_host: torch.Tensor | None = None,
                grammar: tuple[torch.Tensor, torch.Tensor] | None = None) -> SamplerOutput:
        """``grammar``: (rows, token bitmask) of the rows with structured outputs this step
        (structured_output.fill_bitmask), applied first."""
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            raw_logprobs = logits.float().log_softmax(dim=1)
        private = (not metadata.no_penalties or metadata.min_tokens_rows is not None
                   or metadata.logit_bias is not None or metadata.allowed_rows is not None
                   or grammar is not None)
        if private:
            # These stages write: they work on a float32 copy, the caller's logits stay untouched.
            logits = logits.to(torch.float32, copy=True)
            if grammar is not None:
                logits = apply_bitmask(logits, *grammar)
            logits = apply_allowed_token_ids(logits, metadata.allowed_rows, metadata.allowed_pairs)
            logits = apply_min_tokens(logits, metadata.min_tokens_rows,
                                      metadata.min_tokens_token_ids)
            logits = apply_logit_bias(logits, metadata.logit_bias)
            if not metadata.no_penalties:
                logits = apply_penalties(
                    logits, prompt_token_ids=metadata.prompt_token_ids,
                    output_token_ids=metadata.output_token_ids,
                    presence_penalties=metadata.presence_penalties,
                    frequency_penalties=metadata.frequency_penalties,
                    repetition_penalties=metadata.repetition_penalties)
        sampled, host = self.sample(logits, metadata, private=private, sampled_host=sampled_host)
        logprobs_tensors = None
        if raw_logprobs is not None:
            logprobs_tensors = gather_logprobs(raw_logprobs, sampled,
                                               metadata.max_num_logprobs)
        return SamplerOutput(sampled, logprobs_tensors, host)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata, private: bool = False,
               sampled_host: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy and/or random sampling of already-penalized logits (any float dtype),
        which are modified only when `private` (a float32 copy the caller gave up). Returns the
        ids and ``sampled_host`` if a kernel wrote them there too (else None)."""
        if metadata.all_greedy:
            host = sampled_host if greedy_kernel_applies(logits) else None
            return greedy_sample(logits, host), host
        greedy = None if metadata.all_random else greedy_sample(logits)
        if fused_sampling_applies(logits, metadata):
            host = sampled_host if greedy is None else None
            sampled = fused_random_sample(logits, metadata.temperature, metadata.generators,
                                          self.noise_seeds, host)
            if greedy is None:
                return sampled, host
        else:
            if not private:
                logits = logits.to(torch.float32, copy=True)
            logits.div_(metadata.temperature.unsqueeze(1))
            logits = apply_top_k_top_p(logits, metadata.top_k, metadata.max_top_k,
                                       metadata.top_p)
            if metadata.min_p is not None:
                logits = apply_min_p(logits, metadata.min_p)
            sampled = random_sample(logits.softmax(dim=1), metadata.generators)
        if greedy is None:
            return sampled, None
        return torch.where(metadata.greedy_mask, greedy, sampled), None
