"""Launch parameters of the paged decode kernel: the default without a tuned table, and the
context bucket that tuned-table lookups are cached by.

Pure Python (no device queries): VOLTA_PAGED passes the SM count in, and the tuner and the
benchmarks call the same functions, so CPU tests pin the rule down.
"""

from __future__ import annotations

# The kernel's partition-size range ([16, 1024], csrc/attention_checks.h) and the longest
# partition the small-grid rule below uses (longer ones leave an SM too few blocks in flight).
MAX_PARTITION_SIZE = 1024
_LONG_PARTITION_MAX = 512
# Contexts up to this length keep the rule fitted to the H200 sweep at 640 and 4096 tokens.
_FITTED_CONTEXT = 4096
# Blocks the small-grid rule aims for: the 4096-token sweep preferred 128-token partitions
# (about 16 blocks per SM) over fewer, longer ones for small batches.
_TARGET_BLOCKS_PER_SM = 16
# At most this many partitions per sequence past _FITTED_CONTEXT: each leaves D + 2 floats per
# head for the reduce kernel to combine (at 128k tokens, 128-token partitions would leave 1024
# partials per head to one reduce block).
_MAX_PARTITIONS = 512


def heads_per_block(group: int) -> int:
    """Query heads per block of the decode kernel for a GQA group (query heads per KV head): the
    group when <= 8, else its largest divisor <= 8 (as csrc/attention_kernels.cu splits it)."""
    chunks = -(-group // 8)
    while group % chunks:
        chunks += 1
    return group // chunks


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def default_launch_config(num_seqs: int, num_heads: int, num_kv_heads: int, num_sms: int,
                          context_len: int | None = None) -> dict[str, int]:
    """The decode launch on a device without a tuned table, from how many blocks one partition
    of the grid puts on each SM (a block: the heads of one KV head, up to 8, of one sequence)
    and the context the grid spans (``context_len``; None = short).

    - 2 or more blocks per SM: 1024-token partitions with 192 threads (few partials to combine;
      the grid already fills the GPU).
    - Fewer, context up to 4096 tokens: 128-token partitions under 0.75 blocks per SM, else 256.
      Fitted to an H200 sweep of every partition of 64-1024 tokens with 128 / 192 threads, both
      modes, 12 / 2 and 32 / 8 heads of 128, batch 1-256, contexts of 640 and 4096 tokens: 3%
      slower than each shape's best launch on average, 19% at worst, where a fixed 512 / 128 was
      1.5-2.1x slower than the best at 0.02-0.5 blocks per SM.
    - Fewer, longer context: the context split into enough partitions for about 16 blocks per
      SM, each a power of two of 256-512 tokens (128 where 256 leaves under 2 blocks per SM), at
      most 512 partitions. Batch 1 of 4 KV heads at 32k tokens on 132 SMs: 256-token
      partitions, 512 blocks; 8 KV heads at 128k: 512 tokens, 2048 blocks.
    """
    for name, value in (("num_seqs", num_seqs), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if context_len is not None and context_len < 0:
        raise ValueError(f"context_len must be >= 0 or None, got {context_len}")
    sms = max(num_sms, 1)
    blocks = num_seqs * num_heads // heads_per_block(num_heads // num_kv_heads)
    per_sm = blocks / sms
    if per_sm >= 2:
        return {"partition_size": MAX_PARTITION_SIZE, "num_threads": 192}
    if context_len is None or context_len <= _FITTED_CONTEXT:
        return {"partition_size": 128 if per_sm < 0.75 else 256, "num_threads": 128}
    parts = -(-_TARGET_BLOCKS_PER_SM * sms // blocks)
    size = _next_pow2(-(-context_len // parts))
    # 256 tokens at least where that still gives 2 blocks per SM (fewer partials; a 1-2 KV-head
    # model on a small GPU needs 128), and few enough partitions for the reduce.
    shortest = 256 if blocks * -(-context_len // 256) >= 2 * sms else 128
    shortest = max(shortest, _next_pow2(-(-context_len // _MAX_PARTITIONS)))
    return {"partition_size": min(max(size, shortest), _LONG_PARTITION_MAX), "num_threads": 128}


def context_bucket(context_len: int) -> int:
    """``context_len`` rounded up to a quarter of an octave (4 buckets per power of two: 4097 ->
    5120, 33000 -> 40960): the launch-config caches key on it, so an eager decode step, whose
    context grows by one token per step, looks a table up once per bucket, and the bucket is
    within an eighth of an octave of any tuned context it is matched to."""
    if context_len <= 8:
        return max(context_len, 1)
    step = 1 << (context_len.bit_length() - 3)
    return -(-context_len // step) * step
