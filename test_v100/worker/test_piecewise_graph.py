"""Piecewise CUDA graphs: capture sizes, and replays around eager attention == the eager forward."""
from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import random_prompts, save_tiny_model
from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import ScheduledRequest
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.worker.inputs import prepare_inputs
from vllm_volta.worker.piecewise_graph import piecewise_sizes

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Heads of 64: the CUDA attention backend's smallest head size (the tiny default is 16).
WIDE = dict(hidden_size=256, intermediate_size=512, head_dim=64)


def test_piecewise_sizes():
    assert piecewise_sizes(8192) == ([8, 16, 32, 64, 128, 192, 256, 320, 384, 448]
                                     + list(range(512, 2049, 128)))
    assert piecewise_sizes(300) == [8, 16, 32, 64, 128, 192, 256, 300]
    assert piecewise_sizes(256) == [8, 16, 32, 64, 128, 192, 256]
    assert piecewise_sizes(5) == [5]
    assert piecewise_sizes(4096, cap=1000) == [8, 16, 32, 64, 128, 192, 256, 320, 384, 448, 512,
                                               640, 768, 896, 1000]


def test_cudagraph_mode_is_checked(tmp_path):
    from vllm_volta.engine.arg_utils import EngineArgs
    save_tiny_model(tmp_path, "llama")
    with pytest.raises(ValueError, match="cudagraph_mode must be one of .*FULL_DECODE_ONLY"):
        EngineArgs(str(tmp_path), cudagraph_mode="PIECEWISE_ONLY").create_engine_config()
    config = EngineArgs(str(tmp_path), cudagraph_mode="full_decode_only").create_engine_config()
    assert config.model_config.cudagraph_mode == "FULL_DECODE_ONLY"


def _llm(path, **kwargs):
    from vllm_volta import LLM
    return LLM(str(path), skip_tokenizer_init=True, dtype="float16", gpu_memory_utilization=0.3,
               max_num_seqs=16, max_num_batched_tokens=256, **kwargs)


@gpu
@needs_cuda
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_engine_piecewise_graphs_match_eager(tmp_path, arch, async_scheduling):
    """Prompts of 3-300 tokens under a 256-token budget (chunked prompts next to decodes): the
    pieces replay for those steps and the greedy tokens are the eager engine's."""
    save_tiny_model(tmp_path, arch, **WIDE)
    prompts = random_prompts(12, 3, 300, seed=5)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = _llm(tmp_path, async_scheduling=async_scheduling, cudagraph_metrics=True)
    runner = llm.llm_engine.executor.worker.model_runner
    runner.graph_metrics.interval = float("inf")  # keep every count (a log would reset them)
    assert runner.attn_backend.name == "VOLTA_PAGED"
    pieces = runner.piecewise_runner
    assert pieces.sizes == [8, 16, 32, 64, 128, 192, 256]
    assert all(len(pieces.graphs[s]) == 3 for s in pieces.sizes)  # 2 layers: 3 pieces
    out = llm.generate(prompts, params, use_tqdm=False)
    assert pieces.num_replays > 0 and runner.graph_runner.num_replays > 0
    steps = {"FULL": 0, "PIECEWISE": 0, "NONE": 0}  # what --cudagraph-metrics counted
    for (tokens, padded, mode), count in runner.graph_metrics._counts.items():
        steps[mode] += count
        assert padded in pieces.sizes if mode == "PIECEWISE" else padded >= tokens
        assert padded == tokens or mode != "NONE"
    assert steps["FULL"] == runner.graph_runner.num_replays
    assert steps["PIECEWISE"] == pieces.num_replays
    del llm
    eager = _llm(tmp_path, enforce_eager=True).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in eager]


@gpu
@needs_cuda
def test_decode_only_mode_captures_no_pieces(tmp_path):
    save_tiny_model(tmp_path, "llama", **WIDE)
    llm = _llm(tmp_path, cudagraph_mode="FULL_DECODE_ONLY")
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.graph_runner is not None and runner.piecewise_runner is None


def _mixed_step(num_decodes: int, prompt_lens: list[int], block_size: int, gen: torch.Generator
                ) -> list[ScheduledRequest]:
    """Decodes of 20-60 token contexts, then fresh prompts; blocks numbered from 1 in order."""
    steps, next_block = [], 1
    for i in range(num_decodes + len(prompt_lens)):
        decode = i < num_decodes
        length = int(torch.randint(20, 61, (), generator=gen)) if decode else prompt_lens[i - num_decodes]
        ids = torch.randint(4, 384, (length,), generator=gen).tolist()
        req = Request(f"r{i}", ids, SamplingParams(), max_tokens=4, block_size=block_size)
        blocks = list(range(next_block, next_block + -(-length // block_size)))
        next_block += len(blocks)
        if decode:
            steps.append(ScheduledRequest.make(req, 1, length - 1, blocks))
        else:
            steps.append(ScheduledRequest.make(req, length, 0, blocks))
    return steps


@gpu
@needs_cuda
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_replay_equals_eager_forward(tmp_path, arch):
    """The runner's forward for mixed steps of several sizes (padding rows holding an earlier,
    larger step's values) against the model's eager forward on the same inputs and cache."""
    save_tiny_model(tmp_path, arch, **WIDE)
    llm = _llm(tmp_path)
    runner = llm.llm_engine.executor.worker.model_runner
    pieces, device, block_size = runner.piecewise_runner, runner.device, runner.block_size
    gen = torch.Generator().manual_seed(0)
    for num_decodes, prompt_lens in ((3, [120, 100]), (2, [7]), (0, [40, 41]), (5, [])):
        inp = prepare_inputs(_mixed_step(num_decodes, prompt_lens, block_size, gen), block_size, device)
        n = inp.num_tokens
        assert pieces.can_run(inp) and pieces.padded_size(n) >= n
        before = pieces.num_replays
        with torch.inference_mode():
            replayed = pieces.run(inp).clone()
            eager = runner.model(inp.input_ids, inp.positions, runner.kv_caches, inp.attn_metadata,
                                 final_norm=False)
        assert pieces.num_replays == before + 1
        assert replayed.shape == eager.shape == (n, 256)
        torch.testing.assert_close(replayed, eager, rtol=2e-3, atol=2e-3)
