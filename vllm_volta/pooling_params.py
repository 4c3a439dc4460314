"""PoolingParams: what an embedding request asks for (vLLM's class for ``LLM.embed`` and
``/v1/embeddings``).

An embedding is the final hidden state (after the model's last norm) of the prompt's last token,
as decoder embedding models (Qwen3-Embedding, e5-mistral, gte-Qwen2) define it; ``dimensions``
keeps its first N entries (Matryoshka models), then ``normalize`` scales it to unit length.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_volta.sampling_params import SamplingParams


@dataclass
class PoolingParams:
    dimensions: int | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive int or None, got {self.dimensions!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be a bool, got {self.normalize!r}")

    def verify(self, hidden_size: int) -> None:
        """ValueError when ``dimensions`` exceeds the model's hidden size."""
        if self.dimensions is not None and self.dimensions > hidden_size:
            raise ValueError(f"dimensions: {self.dimensions} is larger than the model's embedding size "
                             f"({hidden_size}); allowed: 1 to {hidden_size}")

    def sampling_params(self) -> SamplingParams:
        """How the engine runs the request: its prompt, then one greedy step whose token is not
        returned (the step that computes the last prompt token's hidden state)."""
        return SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
