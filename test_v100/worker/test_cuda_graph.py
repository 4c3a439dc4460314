"""CUDA graphs for decode: capture sizes, padding, and graph output == eager output."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from vllm_volta.core.kv_cache_groups import single_table_layout
from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import ScheduledRequest
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.worker.cuda_graph import CudaGraphRunner, default_capture_sizes
from vllm_volta.worker.driver_graph import DriverGraph
from vllm_volta.worker.inputs import prepare_inputs

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_default_capture_sizes():
    assert default_capture_sizes(1) == [1]
    assert default_capture_sizes(20) == [1, 2, 4, 8, 16]
    assert default_capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert default_capture_sizes(256)[-1] == 256
    assert default_capture_sizes(300)[-4:] == [248, 256, 272, 288]  # steps of 16 from 256
    assert default_capture_sizes(1024)[-1] == 1024
    assert default_capture_sizes(4096)[-1] == 1024  # capped
    assert default_capture_sizes(64, requested=[3, 1, 100, 3]) == [1, 3]


def stub_runner(model, caches, device, block_size, max_model_len, max_seq_len_to_capture=8192):
    return SimpleNamespace(
        model=model, kv_caches=caches, device=device, block_size=block_size,
        kv_cache_layout=lambda: single_table_layout([], block_size),
        model_config=SimpleNamespace(max_model_len=max_model_len,
                                     max_seq_len_to_capture=max_seq_len_to_capture),
        vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(cuda_graph_sizes=None),
                                    cache_config=SimpleNamespace(num_state_slots=0)))


def test_which_steps_replay_a_graph():
    """can_run / padded_size decide on CPU too (nothing is captured here)."""
    graphs = CudaGraphRunner(stub_runner(None, [], torch.device("cpu"), 8, 512,
                                         max_seq_len_to_capture=64), [1, 2, 4, 8])
    assert (graphs.max_seq_len, graphs.max_blocks) == (64, 8)
    gen = torch.Generator().manual_seed(0)
    decode = decode_batch(5, 8, gen)
    inp = prepare_inputs(decode, 8, torch.device("cpu"))
    assert graphs.can_run(inp) and graphs.padded_size(5) == 8 and graphs.padded_size(1) == 1
    assert not graphs.can_run(prepare_inputs(decode_batch(9, 8, gen), 8, torch.device("cpu")))
    prefill = [ScheduledRequest.make(decode[0].request, 2, decode[0].num_computed_tokens - 1,
                                     decode[0].block_ids)] + decode[1:]
    assert not graphs.can_run(prepare_inputs(prefill, 8, torch.device("cpu")))
    req = Request("long", list(range(70)), SamplingParams(), max_tokens=1, block_size=8)
    long_ctx = [ScheduledRequest.make(req, 1, 69, list(range(1, 10)))]
    assert not graphs.can_run(prepare_inputs(long_ctx, 8, torch.device("cpu")))


class ToyDecodeModel(nn.Module):
    """A capturable stand-in with the Model interface: writes each new token's embedding
    into the paged cache, then attends over the sequence's context through the block table
    (fixed shapes, masks instead of host-side lengths). As the engine's models, it can leave its
    final norm to the logits (``final_norm=False``, what the graphs capture)."""

    def __init__(self, vocab: int = 50, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, input_ids, positions, kv_caches, md, final_norm: bool = True):
        x = self.embed(input_ids) + 0.01 * positions[:, None].float()
        cache = kv_caches[0][0]  # [num_blocks, block_size, 1, hidden]
        num_blocks, block_size, _, hidden = cache.shape
        flat = cache.view(-1, hidden)
        slots = md.slot_mapping
        # Padding rows (-1) write into the null block's slot 0, which no request reads.
        flat.index_copy_(0, torch.where(slots >= 0, slots, torch.zeros_like(slots)), x)
        ctx = cache.view(num_blocks, block_size, hidden)[md.block_table.long()].flatten(1, 2)
        valid = (torch.arange(ctx.shape[1], device=x.device)[None, :]
                 < md.seq_lens[:, None])
        scores = (ctx @ x[:, :, None]).squeeze(-1).masked_fill(~valid, float("-inf"))
        out = self.proj((scores.softmax(-1)[:, :, None] * ctx).sum(1) + x)
        return self.norm(out) if final_norm else out


def decode_batch(num_seqs: int, block_size: int, gen: torch.Generator):
    batch = []
    for i in range(num_seqs):
        ctx = int(torch.randint(1, 60, (1,), generator=gen))
        tokens = torch.randint(0, 50, (ctx,), generator=gen).tolist()
        req = Request(f"s{i}", tokens, SamplingParams(), max_tokens=1, block_size=block_size)
        nblocks = -(-ctx // block_size)
        blocks = list(range(1 + i * 8, 1 + i * 8 + nblocks))  # 8 blocks reserved per seq
        batch.append(ScheduledRequest.make(req, 1, ctx - 1, blocks))
    return batch


@gpu
@needs_cuda
@pytest.mark.parametrize("capture_path", ["driver", "torch"])
def test_graph_replay_equals_eager_with_padding(clean_env, capture_path):
    clean_env.setenv("VLLM_VOLTA_CUDA_GRAPH_CAPTURE", capture_path)
    device = torch.device("cuda")
    block_size, max_model_len = 8, 64
    torch.manual_seed(0)
    model = ToyDecodeModel().to(device).eval()
    caches = [torch.randn(2, 1 + 8 * 40, block_size, 1, 16, device=device)]
    graphs = CudaGraphRunner.capture(stub_runner(model, caches, device, block_size, max_model_len),
                                     max_num_seqs=40)
    assert graphs.sizes == [1, 2, 4, 8, 16, 24, 32, 40]
    graph_type = DriverGraph if capture_path == "driver" else torch.cuda.CUDAGraph
    assert all(type(g) is graph_type for g in graphs.graphs.values())
    gen = torch.Generator().manual_seed(1)
    for num_seqs in (1, 3, 8, 17, 40):
        inp = prepare_inputs(decode_batch(num_seqs, block_size, gen), block_size, device)
        assert graphs.can_run(inp)
        with torch.inference_mode():
            eager = model(inp.input_ids, inp.positions, caches, inp.attn_metadata, final_norm=False)
            replayed = graphs.run(inp).clone()
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    assert graphs.num_replays == 5
    prefill = decode_batch(2, block_size, gen)
    prompt = Request("p0", [1, 2, 3, 4, 5], SamplingParams(), max_tokens=1, block_size=block_size)
    prefill[0] = ScheduledRequest.make(prompt, 5, 0, [1])  # a 5-token prefill: never graphed
    assert not graphs.can_run(prepare_inputs(prefill, block_size, device))


@gpu
@needs_cuda
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_engine_cuda_graphs_match_eager(tmp_path, async_scheduling):
    """With a capturable attention backend, graph decoding gives the eager tokens (with async
    scheduling too: the ids reach the host through the sampler's pinned buffers and the next
    step's input ids are staged from the device)."""
    from test_v100.worker.tiny_models import random_prompts, save_tiny_model
    from vllm_volta import LLM
    # Heads of 64: the CUDA attention backend's smallest head size (the tiny default is 16).
    save_tiny_model(tmp_path, "llama", hidden_size=256, intermediate_size=512, head_dim=64)
    prompts = random_prompts(12, 3, 40, seed=2)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    common = dict(skip_tokenizer_init=True, dtype="float16", gpu_memory_utilization=0.3,
                  max_num_seqs=16)
    graph_llm = LLM(str(tmp_path), async_scheduling=async_scheduling, **common)
    runner = graph_llm.llm_engine.executor.worker.model_runner
    assert runner.attn_backend.name == "VOLTA_PAGED" and runner.graph_runner is not None
    graph_out = graph_llm.generate(prompts, params, use_tqdm=False)
    assert runner.graph_runner.num_replays > 0
    del graph_llm
    eager_out = LLM(str(tmp_path), enforce_eager=True, **common).generate(prompts, params,
                                                                          use_tqdm=False)
    assert [o.outputs[0].token_ids for o in graph_out] == [
        o.outputs[0].token_ids for o in eager_out]


@gpu
@needs_cuda
def test_load_fills_static_buffers_and_padding_rows():
    """The staging before a replay: real rows from the step (input ids replaced by the previous
    step's samples when the step says so), padding rows reset even where an earlier, larger step
    left values."""
    device = torch.device("cuda")
    graphs = CudaGraphRunner(stub_runner(None, [], device, 8, 512, max_seq_len_to_capture=64),
                             [1, 2, 4, 8])
    gen = torch.Generator().manual_seed(3)
    for num, replace in ((8, False), (3, True), (5, False), (1, True), (6, True), (2, False)):
        inp = prepare_inputs(decode_batch(num, 8, gen), 8, device)
        if replace:
            inp.replace_ids = torch.randint(0, 1000, (num,), generator=gen).to(device)
        md = inp.attn_metadata
        size = graphs.load(inp)
        assert size == graphs.padded_size(num)
        width = md.block_table.shape[1]
        ids = inp.replace_ids if replace else inp.input_ids
        assert graphs.input_ids[:num].tolist() == ids.tolist()
        assert graphs.positions[:num].tolist() == inp.positions.tolist()
        assert graphs.slot_mapping[:num].tolist() == md.slot_mapping.tolist()
        assert graphs.seq_lens[:num].tolist() == md.seq_lens.tolist()
        assert torch.equal(graphs.block_table[:num, :width], md.block_table)
        pad = slice(num, size)
        assert graphs.input_ids[pad].tolist() == [0] * (size - num)
        assert graphs.positions[pad].tolist() == [0] * (size - num)
        assert graphs.slot_mapping[pad].tolist() == [-1] * (size - num)
        assert graphs.seq_lens[pad].tolist() == [1] * (size - num)
        assert graphs.block_table[pad, 0].tolist() == [0] * (size - num)


@gpu
@needs_cuda
def test_load_stages_every_kv_cache_group():
    """With two KV-cache groups (blocks of 8 and 16, the second a window with freed entries),
    each group's block table and slot mapping reach its static buffers; padding rows: slot -1,
    block 0."""
    from dataclasses import replace

    from vllm_volta.core.kv_cache_groups import KVCacheGroup, KVCacheLayout
    device = torch.device("cuda")
    layout = KVCacheLayout((KVCacheGroup(8, None, (0,)), KVCacheGroup(16, 8, (1,))), (0, 1), 256)
    runner = stub_runner(None, [], device, 8, 512, max_seq_len_to_capture=64)
    runner.kv_cache_layout = lambda: layout
    graphs = CudaGraphRunner(runner, [1, 2, 4, 8])
    (table1, slots1), = graphs.group_buffers
    assert table1.shape == (8, 4)
    gen = torch.Generator().manual_seed(4)
    for num in (8, 3, 6):
        batch = []
        for i, s in enumerate(decode_batch(num, 8, gen)):
            ctx = s.num_computed_tokens + 1
            second = [0] * ((ctx - 1) // 16) + [100 + i]  # only the last block of 16 kept
            batch.append(replace(s, group_block_ids=(s.block_ids, second)))
        inp = prepare_inputs(batch, 8, device, group_block_sizes=[8, 16])
        md = inp.attn_metadata
        assert graphs.can_run(inp)
        size = graphs.load(inp)
        src_table, src_slots = md.kv_groups[1]
        assert torch.equal(table1[:num, :src_table.shape[1]], src_table)
        assert slots1[:num].tolist() == src_slots.tolist()
        assert slots1[:num].tolist() == [(100 + i) * 16 + (s.num_computed_tokens % 16) for i, s in enumerate(batch)]
        assert slots1[num:size].tolist() == [-1] * (size - num)
        assert table1[num:size, 0].tolist() == [0] * (size - num)
        view = graphs._metadata(size).for_group(1)
        assert view.block_table.data_ptr() == table1.data_ptr() and view.slot_mapping.data_ptr() == slots1.data_ptr()
