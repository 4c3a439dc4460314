from __future__ import annotations

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
