"""SamplingMetadata: the batch's per-row sampling parameters as tensors on the logits' device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from vllm_volta.host_copy import to_device
from vllm_volta.sampling_params import SamplingParams, SamplingType

# Mixing constant for child seeds (a large odd number, so (seed, i) pairs rarely collide).
_CHILD_SEED_STRIDE = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 63) - 1


def make_generator(seed: int, child_index: int = 0,
                   device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of child `child_index` of a request seeded with `seed`.

    Child 0 uses `seed` itself, so an n=1 request is seeded exactly by its seed; child i
    mixes (seed, i) so that siblings draw different samples. The engine creates one per
    sequence and keeps it for the sequence's lifetime (its state advances every step).
    """
    mixed = (seed + child_index * _CHILD_SEED_STRIDE) & _SEED_MASK
    gen = torch.Generator(device=device)
    gen.manual_seed(mixed)
    return gen


def _pad(rows: Sequence[Sequence[int]], pad: int) -> list[list[int]]:
    width = max((len(r) for r in rows), default=0)
    return [list(r) + [pad] * (width - len(r)) for r in rows]


@dataclass
class SamplingMetadata:
    """Batched sampling state for B rows; every None/flag lets the sampler skip a stage.

    temperature holds 1.0 for greedy rows (they are argmax-ed, never divided); top_k uses
    0 for "off"; token-id tensors are padded with -1.
    """

    temperature: torch.Tensor | None      # [B] f32; None when all rows are greedy
    greedy_mask: torch.Tensor | None      # [B] bool; None unless greedy and random rows mix
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None            # [B] f32; None when no row uses top-p
    top_k: torch.Tensor | None            # [B] int64; None when no row uses top-k
    max_top_k: int                        # largest top_k in the batch (0 if none)
    min_p: torch.Tensor | None            # [B] f32; None when no row uses min-p
    generators: dict[int, torch.Generator]  # row -> generator, for seeded random rows
    max_num_logprobs: int | None          # None when no row asked for logprobs
    no_penalties: bool
    presence_penalties: torch.Tensor | None    # [B] f32
    frequency_penalties: torch.Tensor | None   # [B] f32
    repetition_penalties: torch.Tensor | None  # [B] f32
    prompt_token_ids: torch.Tensor | None      # [B, Lp] int64, -1 padded
    output_token_ids: torch.Tensor | None      # [B, Lo] int64, -1 padded
    min_tokens_rows: torch.Tensor | None       # [M] int64 } (row, token) pairs to mask
    min_tokens_token_ids: torch.Tensor | None  # [M] int64 } while min_tokens is unmet
    # logit_bias: (rows [K], token ids [K], values [K] f32); None when no row sets one.
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # allowed_token_ids: the restricted rows [R], and (index into them, allowed id) pairs [2, M].
    allowed_rows: torch.Tensor | None = None
    allowed_pairs: torch.Tensor | None = None
    # Rows with structured outputs: their grammar masks are made each step (the model runner).
    structured_rows: list[int] | None = None

    @property
    def no_top_p(self) -> bool:
        return self.top_p is None

    @property
    def no_top_k(self) -> bool:
        return self.top_k is None

    @property
    def no_min_p(self) -> bool:
        return self.min_p is None

    @classmethod
    def build(cls, params: Sequence[SamplingParams], *,
              output_token_ids: Sequence[Sequence[int]],
              prompt_token_ids: Sequence[Sequence[int]] | None = None,
              generators: Sequence[torch.Generator | None]
              | Mapping[int, torch.Generator] | None = None,
              device: torch.device | str = "cpu") -> SamplingMetadata:
        """Build the metadata for one step.

        params[i], output_token_ids[i] (generated so far, also the min_tokens count) and
        prompt_token_ids[i] (needed only for repetition_penalty) describe row i;
        generators gives the persistent generator of each seeded row (on `device`).
        """
        num_rows = len(params)
        if len(output_token_ids) != num_rows:
            raise ValueError(f"output_token_ids has {len(output_token_ids)} rows, "
                             f"expected {num_rows} (one per SamplingParams).")
        rows = _gather_rows(params, output_token_ids, _generator_map(generators))
        device = torch.device(device)
        all_greedy = rows.num_greedy == num_rows
        all_random = rows.num_greedy == 0
        _, top_ps, min_ps, _, _, repetitions, _ = rows.floats
        no_penalties = not any(p.has_penalties for p in params)
        needs_table = not (all_greedy and no_penalties)
        # One host->device copy for all float parameters (none on the plain greedy path).
        table = (to_device(rows.floats, device, torch.float32)
                 if needs_table else torch.empty(7, 0, device=device))
        temp_t, top_p_t, min_p_t, pres_t, freq_t, rep_t, greedy_t = table.unbind(0)
        max_top_k = max(rows.top_ks, default=0)

        def ids_tensor(id_rows: Sequence[Sequence[int]]) -> torch.Tensor:
            return to_device(_pad(id_rows, -1), device, torch.int64)

        min_t = ids_tensor([rows.min_rows, rows.min_ids]) if rows.min_rows else None
        bias = None
        if rows.bias_rows:
            bias_ids = ids_tensor([rows.bias_rows, rows.bias_ids])
            bias = (bias_ids[0], bias_ids[1], to_device(rows.bias_values, device, torch.float32))
        allowed_rows = allowed_pairs = None
        if rows.allowed_rows:
            allowed_rows = ids_tensor([rows.allowed_rows])[0]
            allowed_pairs = ids_tensor([rows.allowed_index, rows.allowed_ids])
        prompt_t = output_t = None
        if not no_penalties:
            output_t = ids_tensor(output_token_ids)
            if any(r != 1.0 for r in repetitions):
                if prompt_token_ids is None or len(prompt_token_ids) != num_rows:
                    raise ValueError("prompt_token_ids (one list per row) is required when a "
                                     "row uses repetition_penalty.")
                prompt_t = ids_tensor(prompt_token_ids)
        return cls(
            temperature=None if all_greedy else temp_t,
            greedy_mask=None if all_greedy or all_random else greedy_t > 0.5,
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=None if all(v == 1.0 for v in top_ps) else top_p_t,
            top_k=None if max_top_k == 0 else ids_tensor([rows.top_ks])[0],
            max_top_k=max_top_k,
            min_p=None if not any(min_ps) else min_p_t,
            generators=rows.generators,
            max_num_logprobs=rows.max_num_logprobs,
            no_penalties=no_penalties,
            presence_penalties=None if no_penalties else pres_t,
            frequency_penalties=None if no_penalties else freq_t,
            repetition_penalties=None if no_penalties else rep_t,
            prompt_token_ids=prompt_t,
            output_token_ids=output_t,
            min_tokens_rows=None if min_t is None else min_t[0],
            min_tokens_token_ids=None if min_t is None else min_t[1],
            logit_bias=bias,
            allowed_rows=allowed_rows,
            allowed_pairs=allowed_pairs,
            structured_rows=[i for i, p in enumerate(params) if p.structured_outputs is not None] or None,
        )


def _generator_map(generators: Sequence[torch.Generator | None]
                   | Mapping[int, torch.Generator] | None) -> dict[int, torch.Generator]:
    if generators is None:
        return {}
    if isinstance(generators, Mapping):
        return dict(generators)
    return {i: g for i, g in enumerate(generators) if g is not None}


@dataclass
class _Rows:
    """Per-row values gathered in one Python pass, turned into tensors afterwards."""

    # temperature (1.0 for greedy), top_p, min_p, presence, frequency, repetition, is_greedy
    floats: list[list[float]] = field(default_factory=lambda: [[] for _ in range(7)])
    top_ks: list[int] = field(default_factory=list)
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    num_greedy: int = 0
    max_num_logprobs: int | None = None
    min_rows: list[int] = field(default_factory=list)  # (row, stop id) pairs to mask
    min_ids: list[int] = field(default_factory=list)
    bias_rows: list[int] = field(default_factory=list)  # (row, id, value) per logit_bias entry
    bias_ids: list[int] = field(default_factory=list)
    bias_values: list[float] = field(default_factory=list)
    allowed_rows: list[int] = field(default_factory=list)  # rows with allowed_token_ids
    allowed_index: list[int] = field(default_factory=list)  # (index into allowed_rows, id) pairs
    allowed_ids: list[int] = field(default_factory=list)


def _gather_rows(params: Sequence[SamplingParams], output_token_ids: Sequence[Sequence[int]],
                 gen_map: dict[int, torch.Generator]) -> _Rows:
    rows = _Rows()
    temps, top_ps, min_ps, presences, frequencies, repetitions, greedy = rows.floats
    for i, p in enumerate(params):
        kind = p.sampling_type
        is_greedy = kind == SamplingType.GREEDY
        rows.num_greedy += is_greedy
        greedy.append(float(is_greedy))
        temps.append(1.0 if is_greedy else p.temperature)
        if kind == SamplingType.RANDOM_SEED:
            if i not in gen_map:
                raise ValueError(f"row {i} has seed={p.seed} but no generator; the engine "
                                 "must keep one per seeded sequence.")
            rows.generators[i] = gen_map[i]
        top_ps.append(p.top_p)
        rows.top_ks.append(p.top_k)
        min_ps.append(p.min_p)
        presences.append(p.presence_penalty)
        frequencies.append(p.frequency_penalty)
        repetitions.append(p.repetition_penalty)
        if p.logprobs is not None:
            rows.max_num_logprobs = max(rows.max_num_logprobs or 0, p.logprobs)
        if p.min_tokens and len(output_token_ids[i]) < p.min_tokens:
            stop_ids = p.all_stop_token_ids
            rows.min_rows.extend([i] * len(stop_ids))
            rows.min_ids.extend(stop_ids)
        if p.logit_bias:
            rows.bias_rows.extend([i] * len(p.logit_bias))
            rows.bias_ids.extend(p.logit_bias)
            rows.bias_values.extend(p.logit_bias.values())
        if p.allowed_token_ids:
            rows.allowed_index.extend([len(rows.allowed_rows)] * len(p.allowed_token_ids))
            rows.allowed_rows.append(i)
            rows.allowed_ids.extend(p.allowed_token_ids)
    return rows
