from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers import vocab_parallel_embedding as vpe


gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embedding_lookup_equals_f_embedding(device, dtype):
    """Every lookup size, both sides of the indexed 2-16 id window, gives F.embedding's rows."""
    table = torch.randn(1000, 64, device=device).to(dtype)
    gen = torch.Generator().manual_seed(0)
    for n in range(0, 20):
        ids = torch.randint(0, 1000, (n,), generator=gen)
        ids[: n // 2] = 7  # repeated ids too
        ids = ids.to(device)
        assert torch.equal(vpe.embedding_lookup(ids, table), F.embedding(ids, table))
    ids2d = torch.randint(0, 1000, (3, 4), generator=gen).to(device)
    assert torch.equal(vpe.embedding_lookup(ids2d, table), F.embedding(ids2d, table))


def test_embedding_and_tied_head():
    table = torch.randn(11, 6)
    emb = vpe.VocabParallelEmbedding(11, 6)
    emb.weight.weight_loader(emb.weight, table)
    ids = torch.tensor([0, 10, 3, 3])
    torch.testing.assert_close(emb(ids), F.embedding(ids, table))
    head = vpe.ParallelLMHead(11, 6).tie_weights(emb)
    assert head.weight is emb.weight
    with pytest.raises(ValueError, match="vocab_size=11"):
        emb.weight.weight_loader(emb.weight, torch.randn(12, 6))


def test_tp2_rows_and_masked_lookup(set_tp, monkeypatch):
    """Rank r holds rows [r*6, r*6+6) of an 11-row table (last row zero padding); each rank
    embeds only its ids, and the ranks' outputs sum to the full lookup."""
    monkeypatch.setattr(vpe, "tensor_model_parallel_all_reduce", lambda x: x)  # sum by hand
    table = torch.randn(11, 4)
    ids = torch.tensor([0, 5, 6, 10, 7])
    outs = []
    for rank in range(2):
        set_tp(rank, 2)
        emb = vpe.VocabParallelEmbedding(11, 4)
        emb.weight.weight_loader(emb.weight, table)
        assert emb.weight.shape == (6, 4)
        assert torch.equal(emb.weight[: 6 - rank], table[rank * 6:rank * 6 + 6 - rank])
        if rank == 1:
            assert torch.equal(emb.weight[5], torch.zeros(4))
        outs.append(emb(ids))
    torch.testing.assert_close(outs[0] + outs[1], F.embedding(ids, table))
