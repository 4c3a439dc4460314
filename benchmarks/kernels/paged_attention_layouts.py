"""Attention layouts (query heads, KV heads, head size) of the models the paged-decode tuner
covers; kernel-config files are keyed by (head size, KV heads), so layouts that share them are
tuned once.

Shapes from the models' published config.json files; a TP=tp rank holds num_heads / tp query
and num_kv_heads / tp KV heads (layouts whose KV heads do not split are skipped for that tp).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Layout:
    name: str
    num_heads: int
    num_kv_heads: int
    head_size: int

    def as_dict(self) -> dict:
        return asdict(self)

    def split(self, tp: int) -> Layout | None:
        """One rank's heads under tensor parallelism of `tp`, or None when they do not split."""
        if tp == 1:
            return self
        if self.num_heads % tp or self.num_kv_heads % tp:
            return None
        return Layout(f"{self.name} tp{tp}", self.num_heads // tp, self.num_kv_heads // tp, self.head_size)


MODEL_LAYOUTS = {
    layout.name: layout for layout in (
        Layout("qwen2.5-7b", 28, 4, 128),
        Layout("llama-3.1-8b", 32, 8, 128),
        Layout("qwen3-8b", 32, 8, 128),
        Layout("smollm2-135m", 9, 3, 64),  # the default model
        Layout("qwen2.5-1.5b", 12, 2, 128),
        Layout("gemma-3-sliding", 16, 8, 256),  # Gemma 3 12B; Gemma 4's sliding layers are head 256 too
        # Gemma 4's full-attention layers: global_head_dim 512, num_global_key_value_heads KV heads
        # (2 in the MoE model; transformers' default config keeps the sliding layers' 4).
        Layout("gemma-4-full", 16, 2, 512),
        Layout("gemma-4-full-kv4", 8, 4, 512),
    )
}


def resolve_layouts(names: list[str], tps: list[int]) -> list[Layout]:
    """The named layouts ('all' = every one) at each TP size, one per (head size, KV heads)."""
    if "all" in names:
        names = list(MODEL_LAYOUTS)
    unknown = [n for n in names if n not in MODEL_LAYOUTS]
    if unknown:
        raise ValueError(f"--layouts: unknown {unknown}; choose from {sorted(MODEL_LAYOUTS)} or 'all'")
    out: dict[tuple[int, int], Layout] = {}
    for tp in tps:
        for name in names:
            layout = MODEL_LAYOUTS[name].split(tp)
            if layout is not None:
                out.setdefault((layout.head_size, layout.num_kv_heads), layout)
    return list(out.values())
