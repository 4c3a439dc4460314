from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import save_tiny_model
from vllm_volta.config import ModelConfig, ParallelConfig, VllmConfig
from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import ScheduledRequest, SchedulerOutput
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.executor.abstract import Executor
from vllm_volta.executor.uniproc import UniProcExecutor
from vllm_volta.sampling_params import SamplingParams


def test_executor_class_follows_the_parallel_config():
    config = VllmConfig.__new__(VllmConfig)  # only parallel_config is read
    config.parallel_config = ParallelConfig(tensor_parallel_size=2)
    from vllm_volta.executor.multiproc import MultiprocExecutor
    assert Executor.get_class(config) is MultiprocExecutor


def test_uniproc_lifecycle(tmp_path):
    hf_model = save_tiny_model(tmp_path, "llama")
    config = EngineArgs(model=str(tmp_path), skip_tokenizer_init=True,
                        num_gpu_blocks_override=8, block_size=4).create_engine_config()
    assert isinstance(config.model_config, ModelConfig)
    assert Executor.get_class(config) is UniProcExecutor
    executor = UniProcExecutor(config)
    assert executor.determine_num_available_blocks() == 8
    executor.initialize_cache(8)
    prompt = [5, 6, 7, 8, 9]
    req = Request("a", prompt, SamplingParams(temperature=0), max_tokens=1, block_size=4)
    out = executor.execute_model(SchedulerOutput(
        scheduled=[ScheduledRequest.make(req, 5, 0, [1, 2])],
        total_num_scheduled_tokens=5))
    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert out.sampled_token_ids == {"a": [expected]}
    executor.shutdown()
    assert executor.worker is None
    with pytest.raises(RuntimeError, match="shut down"):
        executor.execute_model(SchedulerOutput())
    executor.shutdown()  # idempotent
