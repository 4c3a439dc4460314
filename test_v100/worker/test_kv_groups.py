"""KV-cache groups on the worker side: step inputs per group, AttentionMetadata.for_group, and
each Attention layer told its group."""
from __future__ import annotations

import pytest
import torch

from test_v100.worker.tiny_models import tiny_config
from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import build_attn_metadata
from vllm_volta.core.kv_cache_groups import allocate_group_caches
from vllm_volta.core.kv_cache_spec import FullAttentionSpec
from vllm_volta.core.request import Request
from vllm_volta.core.scheduler import ScheduledRequest
from vllm_volta.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.worker.block_table import BlockTableCache
from vllm_volta.worker.inputs import prepare_inputs
from vllm_volta.worker.kv_groups import plan_model_groups

SIZES = [4, 8, 2]  # three groups' block sizes


def scheduled(n_tokens, num_computed, num_new, tables):
    req = Request(f"r{n_tokens}-{num_computed}", list(range(5, 5 + n_tokens)), SamplingParams(), max_tokens=4,
                  block_size=4)
    return ScheduledRequest.make(req, num_new, num_computed, tables[0], group_block_ids=tuple(tables))


def _batch():
    # A decode, a chunk after a window's freed blocks (0 entries), and a fresh prompt.
    return [
        scheduled(9, 8, 1, [[3, 5, 9], [4, 6], [0, 0, 0, 11, 12]]),
        scheduled(20, 8, 6, [[1, 2, 7, 8], [10, 13], [0, 0, 14, 15, 16, 17, 18]]),
        scheduled(3, 0, 3, [[19], [20], [21, 22]]),
    ]


def test_each_group_gets_its_own_table_and_slots():
    batch = _batch()
    caches = [BlockTableCache() for _ in SIZES[1:]]
    for _ in range(2):  # the second step reuses the cached rows
        inp = prepare_inputs(batch, SIZES[0], torch.device("cpu"), group_block_sizes=SIZES, group_tables=caches)
        md = inp.attn_metadata
        assert len(md.kv_groups) == 3 and md.kv_groups[0][0] is md.block_table
        positions = inp.positions.tolist()
        seq_of = [i for i, s in enumerate(batch) for _ in range(s.num_new_tokens)]
        for g, bs in enumerate(SIZES):
            table, slots = md.kv_groups[g]
            ids = [s.group_block_ids[g] for s in batch]
            assert table.tolist() == [r + [0] * (table.shape[1] - len(r)) for r in ids]
            assert slots.tolist() == [ids[i][p // bs] * bs + p % bs for i, p in zip(seq_of, positions)]
    one = prepare_inputs(batch, SIZES[0], torch.device("cpu"))
    assert one.attn_metadata.kv_groups is None


def test_for_group_views_are_built_once_per_step():
    md = build_attn_metadata([8, 0], [1, 3], [[3, 5, 9], [19]], 4,
                             other_groups=[([[4, 6], [20]], 8)])
    assert md.for_group(0) is md
    view = md.for_group(1)
    assert view is md.for_group(1) and view.for_group(1) is view and view.for_group(0) is md
    assert view.slot_mapping.tolist() == [6 * 8 + 0, 20 * 8 + 0, 20 * 8 + 1, 20 * 8 + 2]
    assert view.block_table.tolist() == [[4, 6], [20, 0]]
    assert view.seq_lens is md.seq_lens and view._step_cache is not md._step_cache
    single = build_attn_metadata([0], [3], [[1]], 4)
    assert single.for_group(2) is single


def test_gemma3_layers_are_told_their_groups():
    config = tiny_config("gemma3", sliding_window=8, num_hidden_layers=4,
                         layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                      "full_attention"])
    model = Gemma3ForCausalLM(config, dtype=torch.float32)
    specs = model.kv_cache_specs()
    layout = plan_model_groups(model, specs, 4)
    assert [(g.sliding_window, g.layers) for g in layout.groups] == [
        (None, (3,)), (8, (0,)), (8, (1,)), (8, (2,))]
    attn = [m for m in model.modules() if isinstance(m, Attention)]
    assert [a.kv_cache_group for a in attn] == [1, 2, 3, 0]
    caches = allocate_group_caches(specs, layout, 5, 0, torch.device("cpu"))
    assert len({c.data_ptr() for c in caches}) == 1  # groups of one layer: one buffer


def test_layers_that_do_not_match_the_caches_fall_back_to_one_table(capsys):
    config = tiny_config("gemma3", sliding_window=8)
    model = Gemma3ForCausalLM(config, dtype=torch.float32)
    specs = model.kv_cache_specs() + [FullAttentionSpec(2, 16, torch.float32)]  # a cache with no layer
    layout = plan_model_groups(model, specs, 4)
    assert layout.num_groups == 1 and not layout.frees_blocks
    assert "3 attention caches" in layout.note and "keeping every token" in capsys.readouterr().out
    assert all(m.kv_cache_group == 0 for m in model.modules() if isinstance(m, Attention))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_models_without_windows_keep_one_table(arch):
    from vllm_volta.model_executor.models.registry import get_model_cls
    config = tiny_config(arch)
    model = get_model_cls(config.architectures or [f"{arch.capitalize()}ForCausalLM"])(config, dtype=torch.float32)
    specs = getattr(model, "kv_cache_specs", lambda: [FullAttentionSpec(2, 16, torch.float32)] * 2)()
    layout = plan_model_groups(model, specs, 16)
    assert layout.num_groups == 1 and not layout.frees_blocks and layout.page_bytes == 0
