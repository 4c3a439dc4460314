"""Content hashes of full KV blocks, chained so a hash names the whole prefix."""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes

# 128-bit digests: collisions would silently reuse wrong KV, so no 64-bit builtin hash().
_DIGEST_SIZE = 16
_ROOT = b"vllm-volta-root"


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash of one full block given its parent block's hash (None for the first block).

    Equal hashes mean equal token prefixes up to and including this block, so a block's
    cached KV can be shared by any request whose prefix hashes the same.
    """
    return hash_blocks(parent, token_ids, len(token_ids))[0]


def hash_blocks(parent: BlockHash | None, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The chained hashes of the full blocks of `token_ids` after `parent` (one conversion of
    the tokens to bytes for all of them; a prompt's blocks are hashed when it is added)."""
    data = memoryview(array("q", token_ids)).cast("B")
    step = 8 * block_size
    hashes = []
    for start in range(0, len(data) - step + 1, step):
        h = hashlib.blake2b(parent if parent is not None else _ROOT, digest_size=_DIGEST_SIZE)
        h.update(data[start:start + step])
        parent = h.digest()
        hashes.append(parent)
    return hashes
