"""The paged decode kernel's default launch (no tuned table) and the context bucket."""

from __future__ import annotations

import math

import pytest

from vllm_volta.attention.backends.paged_decode_launch import (MAX_PARTITION_SIZE, context_bucket,
                                                               default_launch_config, heads_per_block)

# (q heads, kv heads, head size) of the supported models' layouts, TP=1 and TP=2.
LAYOUTS = [(28, 4, 128), (32, 8, 128), (9, 3, 64), (12, 2, 128), (16, 8, 256), (16, 2, 512), (8, 4, 256),
           (14, 2, 128), (16, 4, 128), (6, 1, 128), (8, 1, 512), (40, 8, 128), (64, 8, 128), (32, 32, 96)]
SMS = (40, 80, 132)  # T4, V100, H200


def _grid_blocks(num_seqs, num_heads, num_kv_heads, context, partition):
    return num_seqs * num_heads // heads_per_block(num_heads // num_kv_heads) * math.ceil(context / partition)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", LAYOUTS)
@pytest.mark.parametrize("sms", SMS)
@pytest.mark.parametrize("context", [16_384, 32_768, 40_960, 65_536, 131_072])
def test_batch_1_long_context_fills_the_gpu(num_heads, num_kv_heads, head_size, sms, context):
    """Batch 1 at a long context: at least 2 blocks per SM, partitions of 128-512 tokens."""
    cfg = default_launch_config(1, num_heads, num_kv_heads, sms, context)
    assert 128 <= cfg["partition_size"] <= 512
    # (A single KV head at 16k tokens has 128 blocks of 128 tokens: all there are.)
    assert _grid_blocks(1, num_heads, num_kv_heads, context, cfg["partition_size"]) >= \
        min(2 * sms, _grid_blocks(1, num_heads, num_kv_heads, context, 128))
    # ... and at most 512 partitions of one sequence for the reduce kernel to combine.
    assert math.ceil(context / cfg["partition_size"]) <= 512


@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", LAYOUTS)
@pytest.mark.parametrize("sms", SMS)
@pytest.mark.parametrize("num_seqs", [1, 2, 3, 8, 16, 64, 256, 1024])
@pytest.mark.parametrize("context", [None, 1, 640, 4096, 4097, 8192, 32_768, 131_072])
def test_every_launch_is_valid_and_fills_the_gpu_when_the_context_allows(num_heads, num_kv_heads, head_size,
                                                                         sms, num_seqs, context):
    cfg = default_launch_config(num_seqs, num_heads, num_kv_heads, sms, context)
    p, t = cfg["partition_size"], cfg["num_threads"]
    # The op's limits: partitions a multiple of 32 (whole tensor-core tiles) in [32, 1024],
    # threads a multiple of 32 in [64, 512].
    assert p % 32 == 0 and 32 <= p <= MAX_PARTITION_SIZE and t % 32 == 0 and 64 <= t <= 512
    ctx = context or 4096
    blocks = _grid_blocks(num_seqs, num_heads, num_kv_heads, ctx, p)
    full = _grid_blocks(num_seqs, num_heads, num_kv_heads, ctx, 128)  # the most a 128-token split gives
    assert blocks >= min(2 * sms, full)


def test_short_contexts_keep_the_fitted_rule():
    # H200 (132 SMs), 32 / 8 heads (8 blocks per sequence): < 0.75 per SM -> 128, < 2 -> 256, else 1024.
    for ctx in (None, 640, 4096):
        assert default_launch_config(1, 32, 8, 132, ctx) == {"partition_size": 128, "num_threads": 128}
        assert default_launch_config(16, 32, 8, 132, ctx) == {"partition_size": 256, "num_threads": 128}
        assert default_launch_config(33, 32, 8, 132, ctx) == {"partition_size": 1024, "num_threads": 192}


def test_long_context_examples():
    # Qwen2.5-7B layout, 32k, batch 1 on an H200: 4 blocks per partition, 256-token partitions.
    assert default_launch_config(1, 28, 4, 132, 32_768)["partition_size"] == 256
    # Llama-3.1-8B layout at 128k: 512-token partitions, 256 partitions x 8 blocks.
    assert default_launch_config(1, 32, 8, 132, 131_072)["partition_size"] == 512
    # Batch 8 x 32k of the Qwen2.5-7B layout: 32 blocks per partition -> 512 tokens.
    assert default_launch_config(8, 28, 4, 132, 32_768)["partition_size"] == 512
    # A grid of >= 2 blocks per SM already: the long partitions of the fitted rule.
    assert default_launch_config(128, 28, 4, 132, 32_768) == {"partition_size": 1024, "num_threads": 192}


@pytest.mark.parametrize("args,match", [((0, 8, 8, 132), "num_seqs"), ((1, 8, 3, 132), "multiple"),
                                        ((1, 8, 8, 132, -1), "context_len")])
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        default_launch_config(*args)


def test_context_bucket_is_a_quarter_octave_ceiling():
    assert [context_bucket(n) for n in (1, 7, 8, 9, 16, 17, 4096, 4097, 5120, 5121, 33_000, 131_072)] == \
        [1, 7, 8, 10, 16, 20, 4096, 5120, 5120, 6144, 40_960, 131_072]
    for n in range(1, 20_000, 7):
        b = context_bucket(n)
        assert n <= b < n * 1.25 + 1  # at most a quarter octave above
        assert context_bucket(b) == b  # a bucket is its own bucket
    assert len({context_bucket(n) for n in range(4097, 8193)}) == 4  # 5120, 6144, 7168, 8192
