"""Physical KV blocks: ref counts, an LRU free list, and the prefix-cache index."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from vllm_volta.core.block_hash import BlockHash


class KVCacheBlock:
    """One physical block of the paged KV cache."""

    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # Set once the block is full and its KV is (being) computed; None otherwise.
        self.block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    """All KV blocks of one cache.

    Block 0 is a reserved null block: block tables are padded with 0 and padded batch
    rows (CUDA graphs) may point at it, so no request ever owns it.

    Free blocks sit in an LRU queue (oldest freed first). A free block may still hold
    cached KV (it has a hash); it stays findable by hash until it is handed out again,
    which is when it gets evicted from the index.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # never freed
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[BlockHash, KVCacheBlock] = {}
        self.num_evictions = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free, possibly holding evictable cache)."""
        return len(self._free)

    def get_usage(self) -> float:
        return 1.0 - len(self._free) / self.num_usable_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits (pulling free ones out of the free list)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Hand out `num_blocks` blocks from the LRU end, evicting their cached KV."""
        if num_blocks > len(self._free):
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {len(self._free)} free")
        out = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            self.uncache_block(block)
            self.num_evictions += 1

    def cache_full_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Register a full block under its content hash.

        If another block already holds the same content, the index keeps the first one;
        this block still works for its owner, it just is not shared.
        """
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Drop a block from the prefix-cache index (its KV is not valid after all)."""
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the free list.

        Callers pass blocks in eviction-priority order (a request's tail first), since
        later blocks of a prefix are less likely to be shared.
        """
        for block in ordered_blocks:
            if block is self.null_block:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"double free of KV block {block.block_id}")
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    # Nothing cached: put it at the LRU end so it is reused first.
                    self._free[block.block_id] = block
                    self._free.move_to_end(block.block_id, last=False)
                else:
                    self._free[block.block_id] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Only possible while no block is in use."""
        if len(self._free) != self.num_usable_blocks:
            return False
        for block in self.blocks[1:]:
            block.block_hash = None
        self._cached.clear()
        return True
