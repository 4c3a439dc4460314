from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import tiny_model_dir
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.worker.worker import Worker

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU KV-cache sizing")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory, "qwen3")


def make_worker(model_dir, **kwargs):
    worker = Worker(EngineArgs(model=str(model_dir), skip_tokenizer_init=True,
                               **kwargs).create_engine_config())
    worker.load_model()
    return worker


@cpu_only
def test_cpu_budget_sizes_the_cache(model_dir):
    worker = make_worker(model_dir, cpu_kvcache_space=1 / 1024, block_size=16)  # 1 MiB
    block_bytes = 2 * 16 * 2 * 32 * 4 * 2  # k+v, tokens, kv heads, head dim, fp32, layers
    assert worker.model_runner.kv_cache_block_bytes() == block_bytes
    assert worker.determine_num_available_blocks() == (1 << 20) // block_bytes


@cpu_only
def test_blocks_capped_at_what_the_scheduler_can_use(model_dir):
    worker = make_worker(model_dir, cpu_kvcache_space=1.0, max_num_seqs=2, max_model_len=64)
    assert worker.determine_num_available_blocks() == 2 * 4 + 1


@cpu_only
def test_too_small_budget_is_a_clear_error(model_dir):
    worker = make_worker(model_dir, cpu_kvcache_space=1e-9)
    with pytest.raises(ValueError, match="No room for the KV cache"):
        worker.determine_num_available_blocks()


def test_override_and_initialize_cache(model_dir):
    worker = make_worker(model_dir, num_gpu_blocks_override=7, block_size=8)
    assert worker.determine_num_available_blocks() == 7
    worker.initialize_cache(7)
    caches = worker.model_runner.kv_caches
    assert len(caches) == 2
    assert caches[0].shape == (2, 7, 8, 2, 32) and caches[0].dtype == worker.model_runner.dtype
    assert all(bool((c == 0).all()) for c in caches)
    assert worker.vllm_config.cache_config.num_gpu_blocks == 7


def test_profile_run_runs_a_full_budget_step(model_dir):
    worker = make_worker(model_dir, max_num_batched_tokens=96, max_model_len=40, max_num_seqs=8)
    worker.model_runner.profile_run()  # 3 sequences of <= 40 tokens, then sampling
