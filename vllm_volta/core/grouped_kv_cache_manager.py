"""Block tables per KV-cache group (core/kv_cache_groups.py), from one pool of block ids.

Each request holds one table per group. A full-attention group keeps every block; a
sliding-window group returns to the pool the blocks that lie wholly before the window of the
step's first new token (its keys from position ``num_computed - window + 1`` on are needed) and
puts the null block 0 in their table entries: the kernels mask those positions and read block 0
(zeros) there at most. A step fits only if the blocks every group needs fit in the pool together.

Prefix caching (core/group_prefix_cache.py): each group registers its full blocks under the
request's chained block hashes tagged with the group; a returned block keeps its hash until the
pool hands it out again, so later requests can adopt a window's blocks.
"""
from __future__ import annotations

from collections.abc import Sequence

from vllm_volta.core.block_pool import KVCacheBlock
from vllm_volta.core.group_prefix_cache import GroupHits, block_key, find_hits
from vllm_volta.core.kv_cache_groups import KVCacheLayout, cdiv
from vllm_volta.core.kv_cache_manager import KVCacheManager
from vllm_volta.core.request import Request


class GroupedKVCacheManager(KVCacheManager):
    """KVCacheManager for layouts with several groups or a sliding window.

    ``get_block_ids`` is group 0's table; ``get_group_block_ids`` every group's. As in the base
    class, a table's list of ids is replaced, never changed in place, when it changes.
    ``get_computed_blocks`` returns per-group hit tables (GroupHits) for ``allocate_slots``."""

    def __init__(self, num_blocks: int, layout: KVCacheLayout, num_state_slots: int = 0,
                 max_step_tokens: int | None = None, enable_caching: bool = False) -> None:
        super().__init__(num_blocks, layout.groups[0].block_size, enable_caching, num_state_slots)
        self.layout = layout
        self.groups = layout.groups
        self.max_step_tokens = max_step_tokens
        # Per request, per group: its blocks (null block where freed), the same as ids, how many
        # leading entries are freed already, and how many are registered for prefix caching.
        self._tables: dict[str, list[list[KVCacheBlock]]] = {}
        self._ids: dict[str, tuple[list[int], ...]] = {}
        self._num_freed: dict[str, list[int]] = {}
        self._num_cached_g: dict[str, list[int]] = {}

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks a request of ``num_tokens`` tokens holds at most, over every group."""
        return self.layout.blocks_per_request(num_tokens, self.max_step_tokens)

    def get_computed_blocks(self, request: Request) -> tuple[GroupHits, int]:
        """The longest prefix-cache hit valid in every group (none for prompt-logprob requests)."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return (), 0
        return find_hits(self.pool, self.groups, request)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: GroupHits | Sequence[KVCacheBlock] = ()
                       ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens in every group (after returning what
        fell out of the windows), adopting ``new_computed_blocks`` (get_computed_blocks' hit)
        first. Returns the new blocks, or None (nothing changed) when they do not all fit."""
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        rid = request.request_id
        tables = self._tables.get(rid)
        hits: GroupHits = tuple(new_computed_blocks)
        if hits and tables is not None:
            raise ValueError("prefix-cache hits are adopted by a request's first allocation only")
        num_computed = request.num_computed_tokens + (len(hits[0]) * self.groups[0].block_size if hits else 0)
        total = num_computed + num_new_tokens
        if tables is not None:
            self._free_outside_windows(rid, tables, num_computed)
            need = [cdiv(total, g.block_size) - len(t) for g, t in zip(self.groups, tables)]
        else:
            need = [cdiv(total, g.block_size) - (len(hits[i]) if hits else 0) for i, g in enumerate(self.groups)]
        num_needed = sum(n for n in need if n > 0)
        if num_needed == 0 and tables is not None:
            if self.enable_caching:
                self._cache_full(request, total)
            return []
        if self.has_state_slots and rid not in self._req_to_state_slot:
            if not self._free_state_slots:
                return None
            self._req_to_state_slot[rid] = self._free_state_slots.pop()
        adopted = [b for hg in hits for b in hg if b.block_id != 0]
        # Hits that sit in the free list stop being free once taken.
        if num_needed > self.pool.get_num_free_blocks() - sum(b.ref_cnt == 0 for b in adopted):
            if tables is None:
                self._release_state_slot(rid)
            return None
        if tables is None:
            self.pool.touch(adopted)
            tables = self._tables[rid] = [list(hg) for hg in hits] if hits else [[] for _ in self.groups]
            self._ids[rid] = tuple([b.block_id for b in t] for t in tables)
            self._num_freed[rid] = [sum(b.block_id == 0 for b in t) for t in tables]
            self._num_cached_g[rid] = [len(t) for t in tables]
        new_blocks = self.pool.get_new_blocks(num_needed)
        ids = list(self._ids[rid])
        at = 0
        for g, n in enumerate(need):
            if n > 0:
                blocks = new_blocks[at:at + n]
                at += n
                tables[g].extend(blocks)
                ids[g] = ids[g] + [b.block_id for b in blocks]  # a new list (see the class doc)
        self._ids[rid] = tuple(ids)
        if self.enable_caching:
            self._cache_full(request, total)
        return new_blocks

    def _cache_full(self, request: Request, total_tokens: int) -> None:
        """Register every group's blocks that the step fills (their KV is being written)."""
        rid = request.request_id
        hashes, base = request.block_hashes, request.block_size
        done, tables = self._num_cached_g[rid], self._tables[rid]
        for g, group in enumerate(self.groups):
            bs = group.block_size
            if total_tokens // bs <= done[g] or bs % base:
                continue
            full = min(total_tokens // bs, len(hashes) * base // bs)
            for i in range(done[g], full):
                block = tables[g][i]
                if block.block_id != 0:
                    self.pool.cache_full_block(block, block_key(hashes, base, g, bs, i))
            done[g] = max(done[g], full)

    def _free_outside_windows(self, rid: str, tables: list[list[KVCacheBlock]], num_computed: int) -> None:
        """Return each sliding group's blocks that end before position num_computed - window + 1."""
        freed = self._num_freed[rid]
        ids = None
        for g, group in enumerate(self.groups):
            window = group.sliding_window
            if window is None:
                continue
            first = min(max(num_computed - window + 1, 0) // group.block_size, len(tables[g]))
            if first <= freed[g]:
                continue
            table = tables[g]
            # Tail first, as free() does: the later blocks are the less likely to be reused.
            self.pool.free_blocks(reversed(table[freed[g]:first]))
            null = self.pool.null_block
            table[freed[g]:first] = [null] * (first - freed[g])
            if ids is None:
                ids = list(self._ids[rid])
            ids[g] = [0] * first + ids[g][first:]
            freed[g] = first
        if ids is not None:
            self._ids[rid] = tuple(ids)

    def uncache_uncomputed(self, request: Request, num_computed_tokens: int) -> None:
        """Unregister the request's blocks past ``num_computed_tokens`` in every group (a step
        that was to compute them failed)."""
        rid = request.request_id
        for g, table in enumerate(self._tables.get(rid, ())):
            first = num_computed_tokens // self.groups[g].block_size
            for block in table[first:]:
                self.pool.uncache_block(block)
            done = self._num_cached_g[rid]
            done[g] = min(done[g], first)

    def free(self, request: Request) -> None:
        """Release the request's blocks in every group (tail first) and its state slot."""
        rid = request.request_id
        self._release_state_slot(rid)
        self._ids.pop(rid, None)
        self._num_freed.pop(rid, None)
        self._num_cached_g.pop(rid, None)
        for table in self._tables.pop(rid, ()):
            self.pool.free_blocks(reversed(table))

    def get_block_ids(self, request_id: str) -> list[int]:
        """Group 0's table (0 where freed); not a copy, never changed in place."""
        ids = self._ids.get(request_id)
        return ids[0] if ids else []

    def get_group_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """Every group's table, in group order (lists not copied, never changed in place)."""
        return self._ids.get(request_id) or tuple([] for _ in self.groups)

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request holds now, over every group (freed entries not counted)."""
        return sum(sum(b.block_id != 0 for b in t) for t in self._tables.get(request_id, ()))
