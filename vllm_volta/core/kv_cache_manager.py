"""Per-request block tables on top of the BlockPool, with prefix caching."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_volta.core.block_pool import BlockPool, KVCacheBlock
from vllm_volta.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since start, counted in tokens."""

    queries: int = 0
    hits: int = 0
    requests: int = 0
    hit_requests: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Owns which blocks each request holds.

    The scheduler asks `get_computed_blocks` for a prefix-cache hit when a request is
    first scheduled, then `allocate_slots` each step for the tokens it will compute.
    Full blocks are registered under their hash as soon as their KV is scheduled to be
    written, so later requests (even in the same step: every layer writes the whole
    batch's KV before attending) can share them.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 num_state_slots: int = 0) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        # Recurrent-state slots (hybrid models; core/kv_cache_spec.py MambaSpec): one per
        # running request, taken with its first blocks, returned with them. Slot 0 is scratch.
        self._free_state_slots = list(range(num_state_slots - 1, 0, -1))
        self._req_to_state_slot: dict[str, int] = {}
        self.has_state_slots = num_state_slots > 0
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Same tables as plain ids (read every step for every running request).
        self._req_to_block_ids: dict[str, list[int]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of `num_tokens` fits the whole cache on its own."""
        return self.num_blocks_for(num_tokens) <= self.num_usable_blocks

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def get_usage(self) -> float:
        return self.pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks at the start of the request's tokens.

        At least one token is always left to compute (its logits are needed), and
        requests asking for prompt logprobs skip the cache (they need every position).
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count a lookup whose request was admitted (failed admissions retry later)."""
        stats = self.prefix_cache_stats
        stats.queries += num_tokens
        stats.hits += num_hit_tokens
        stats.requests += 1
        stats.hit_requests += num_hit_tokens > 0

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens of `request`.

        `new_computed_blocks` are prefix-cache hits to adopt first. Returns the newly
        allocated blocks, or None (and changes nothing) when too few blocks are free.
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        req_blocks = self.req_to_blocks.get(request.request_id)
        if req_blocks is not None and not new_computed_blocks:
            # Fast path (most decode steps): the request's last block still has room.
            total_tokens = request.num_computed_tokens + num_new_tokens
            if total_tokens <= len(req_blocks) * self.block_size:
                if (self.enable_caching and total_tokens // self.block_size
                        > self._num_cached_blocks.get(request.request_id, 0)):
                    self._cache_full_blocks(request, req_blocks, total_tokens)
                return []
        if self.has_state_slots and request.request_id not in self._req_to_state_slot:
            if not self._free_state_slots:
                return None
            self._req_to_state_slot[request.request_id] = self._free_state_slots.pop()
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total_tokens = num_computed + num_new_tokens
        num_new_blocks = (self.num_blocks_for(total_tokens) - len(req_blocks)
                          - len(new_computed_blocks))
        # Hits that sit in the free list stop being free once we take them.
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.pool.get_num_free_blocks() - num_free_hits:
            if not req_blocks:
                del self.req_to_blocks[request.request_id]
                self._release_state_slot(request.request_id)
            return None
        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(max(0, num_new_blocks))
        req_blocks.extend(new_computed_blocks)
        req_blocks.extend(new_blocks)
        # A new list, never an in-place extend: get_block_ids hands the list out uncopied.
        self._req_to_block_ids[request.request_id] = (
            self._req_to_block_ids.get(request.request_id, [])
            + [b.block_id for b in new_computed_blocks] + [b.block_id for b in new_blocks])
        if self.enable_caching:
            self._cache_full_blocks(request, req_blocks, total_tokens)
        return new_blocks

    def _cache_full_blocks(self, request: Request, req_blocks: list[KVCacheBlock],
                           total_tokens: int) -> None:
        start = self._num_cached_blocks.get(request.request_id, 0)
        hashes = request.block_hashes  # a property that hashes new blocks: asked once
        num_full = min(total_tokens // self.block_size, len(hashes))
        for i in range(start, num_full):
            self.pool.cache_full_block(req_blocks[i], hashes[i])
        self._num_cached_blocks[request.request_id] = max(start, num_full)

    def uncache_uncomputed(self, request: Request, num_computed_tokens: int) -> None:
        """Unregister the request's blocks past `num_computed_tokens` (a step that was to
        compute them failed, so their KV must never be served as a prefix hit)."""
        first = num_computed_tokens // self.block_size
        for block in self.req_to_blocks.get(request.request_id, ())[first:]:
            self.pool.uncache_block(block)
        if request.request_id in self._num_cached_blocks:
            self._num_cached_blocks[request.request_id] = min(
                self._num_cached_blocks[request.request_id], first)

    def free(self, request: Request) -> None:
        """Release the request's blocks (tail first, so shared prefixes live longest)."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._release_state_slot(request.request_id)
        self._req_to_block_ids.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def _release_state_slot(self, request_id: str) -> None:
        slot = self._req_to_state_slot.pop(request_id, None)
        if slot is not None:
            self._free_state_slots.append(slot)

    def get_state_slot(self, request_id: str) -> int:
        """The request's recurrent-state slot, -1 when the model keeps none."""
        return self._req_to_state_slot.get(request_id, -1)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table. Not a copy, but never changed in place (an allocation
        replaces the list), so a step's scheduled table stays as it was; callers must not
        modify it."""
        return self._req_to_block_ids.get(request_id, [])

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
