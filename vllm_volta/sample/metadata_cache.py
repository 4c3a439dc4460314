"""Reuse of the previous step's SamplingMetadata while the batch does not change.

In steady decoding the sampled rows are the same requests, in the same order, step after
step, and their SamplingParams never change; rebuilding the metadata (a Python pass over
every row plus host->device copies) each step is pure host overhead. Metadata that holds
per-step state - token histories for penalties, min_tokens masks (which lapse as outputs
grow) - is never reused.
"""
from __future__ import annotations

from collections.abc import Hashable

from vllm_volta.sample.metadata import SamplingMetadata


def is_step_invariant(metadata: SamplingMetadata) -> bool:
    """Whether `metadata` stays valid for the same rows in a later step."""
    return metadata.no_penalties and metadata.min_tokens_rows is None


class SamplingMetadataCache:
    """One-entry cache keyed by the batch's row identities (e.g. request ids in row order)."""

    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._metadata: SamplingMetadata | None = None
        self.num_hits = 0  # observable: tests check the cache is really used

    def get(self, key: Hashable) -> SamplingMetadata | None:
        if self._metadata is not None and key == self._key:
            self.num_hits += 1
            return self._metadata
        return None

    def put(self, key: Hashable, metadata: SamplingMetadata) -> None:
        if is_step_invariant(metadata):
            self._key, self._metadata = key, metadata
        else:
            self.clear()

    def clear(self) -> None:
        self._key, self._metadata = None, None
