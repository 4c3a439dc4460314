"""Which decoder layers each pipeline stage holds.

vLLM's rule: ``num_layers // pp_size`` layers per stage, and the ``num_layers % pp_size`` left
over go one each to the stages before the last, from the second-to-last backwards (the last
stage also holds the final norm, LM head and sampling, so it takes no extra layer). For 10
layers on 4 stages: 2, 3, 3, 2; 5 on 3: 2, 2, 1.

``VLLM_PP_LAYER_PARTITION`` overrides it with a comma list of layer counts, one per stage, in
stage order ("5,3" puts layers 0-4 on stage 0 and 5-7 on stage 1).
"""
from __future__ import annotations

from vllm_volta import envs

PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


def parse_partition(text: str, num_layers: int, pp_size: int) -> list[int]:
    """Layer counts per stage from ``VLLM_PP_LAYER_PARTITION``'s text; errors name the variable."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"{PARTITION_ENV}={text!r} must be a comma list of layer counts, one "
                         f"positive integer per pipeline stage (e.g. '{_example(num_layers, pp_size)}')")
    counts = [int(p) for p in parts]
    if len(counts) != pp_size:
        raise ValueError(f"{PARTITION_ENV}={text!r} gives {len(counts)} stage(s); "
                         f"pipeline_parallel_size={pp_size} needs exactly {pp_size} counts")
    if min(counts) < 1:
        raise ValueError(f"{PARTITION_ENV}={text!r}: every stage needs at least 1 layer")
    if sum(counts) != num_layers:
        raise ValueError(f"{PARTITION_ENV}={text!r} sums to {sum(counts)} layers; the model has "
                         f"{num_layers}, the counts must add up to it")
    return counts


def _example(num_layers: int, pp_size: int) -> str:
    return ",".join(map(str, even_partition(num_layers, pp_size))) if num_layers >= pp_size > 0 else "4,4"


def even_partition(num_layers: int, pp_size: int) -> list[int]:
    """vLLM's default split: equal counts, the remainder one each to the stages before the last
    (second-to-last first)."""
    base, rem = divmod(num_layers, pp_size)
    counts = [base] * pp_size
    for k in range(rem):  # rem < pp_size: never reaches the last stage
        counts[pp_size - 2 - k] += 1
    return counts


def stage_layer_counts(num_layers: int, pp_size: int) -> list[int]:
    """Each stage's layer count: ``VLLM_PP_LAYER_PARTITION`` when set, else vLLM's split."""
    if not isinstance(pp_size, int) or pp_size < 1:
        raise ValueError(f"pipeline_parallel_size must be an integer >= 1, got {pp_size!r}")
    if pp_size == 1:
        return [num_layers]
    if num_layers < pp_size:
        raise ValueError(f"pipeline_parallel_size={pp_size} is more than the model's {num_layers} "
                         f"decoder layers; allowed range is [1, {num_layers}]")
    text = envs.get(PARTITION_ENV)
    if text:
        return parse_partition(text, num_layers, pp_size)
    return even_partition(num_layers, pp_size)


def get_pp_indices(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the layers stage ``pp_rank`` of ``pp_size`` holds."""
    counts = stage_layer_counts(num_layers, pp_size)
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pipeline rank must be in [0, {pp_size - 1}], got {pp_rank}")
    start = sum(counts[:pp_rank])
    return start, start + counts[pp_rank]
