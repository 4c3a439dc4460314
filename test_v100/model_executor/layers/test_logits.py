from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_volta.model_executor.layers.logits import LogitsProcessor
from vllm_volta.model_executor.layers.vocab_parallel_embedding import ParallelLMHead


def test_logits_are_the_projection_in_model_dtype():
    w, b = torch.randn(9, 8).half(), torch.randn(9).half()
    head = ParallelLMHead(9, 8, bias=True, params_dtype=torch.float16)
    head.weight.weight_loader(head.weight, w)
    head.bias.weight_loader(head.bias, b)
    h = torch.randn(3, 8).half()
    logits = LogitsProcessor(9)(head, h)
    assert logits.dtype == torch.float16 and logits.shape == (3, 9)
    torch.testing.assert_close(logits.float(), F.linear(h.float(), w.float(), b.float()), atol=2e-2,
                               rtol=2e-3)
    scaled = LogitsProcessor(9, scale=0.5)(head, h)
    torch.testing.assert_close(scaled, logits * 0.5)


def test_soft_cap_in_float32():
    head = ParallelLMHead(9, 8, params_dtype=torch.float16)
    head.weight.weight_loader(head.weight, torch.randn(9, 8).half() * 4)
    h = torch.randn(3, 8).half()
    plain = LogitsProcessor(9)(head, h)
    capped = LogitsProcessor(9, soft_cap=3.0)(head, h)
    assert capped.dtype == torch.float16 and capped.abs().max() <= 3.0
    torch.testing.assert_close(capped, (torch.tanh(plain.float() / 3.0) * 3.0).half())
    with pytest.raises(ValueError, match="soft_cap"):
        LogitsProcessor(9, soft_cap=0.0)


def test_decode_rows_take_gemv_where_the_other_projections_do():
    from vllm_volta.model_executor.layers.decode_gemv import gemv_enabled

    assert LogitsProcessor(9).use_gemv == gemv_enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_decode_logits_on_cuda_match_the_projection(rows):
    # 1-2 rows run the gemv kernel (odd vocab and a bias: ragged block ends), 3 rows cuBLAS.
    torch.manual_seed(rows)
    w, b = torch.randn(1001, 256).half(), torch.randn(1001).half()
    head = ParallelLMHead(1001, 256, bias=True, params_dtype=torch.float16).cuda()
    head.weight.weight_loader(head.weight, w.cuda())
    head.bias.weight_loader(head.bias, b.cuda())
    h = torch.randn(rows, 256).half()
    proc = LogitsProcessor(1000)
    assert proc.use_gemv
    logits = proc(head, h.cuda())
    assert logits.shape == (rows, 1000) and logits.dtype == torch.float16
    ref = F.linear(h.float(), w.float(), b.float())[:, :1000]
    torch.testing.assert_close(logits.float().cpu(), ref, atol=6e-2, rtol=2e-3)
