"""Sampler end to end: greedy, sampling statistics vs the transformers processor chain,
seeded reproducibility across batch compositions, min_tokens and logprobs."""

from __future__ import annotations

import pytest
import torch
from transformers import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from test_v100.chi_square import CHI2_999, chi_square
from vllm_volta.sample import Sampler, SamplingMetadata, make_generator
from vllm_volta.sample.sampler import NoiseSeeds
from vllm_volta.sampling_params import SamplingParams

sampler = Sampler()
_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, _CUDA])]


def _run(logits, params, outputs=None, prompts=None, generators=None, device="cpu"):
    outputs = outputs if outputs is not None else [[] for _ in params]
    meta = SamplingMetadata.build(params, output_token_ids=outputs, prompt_token_ids=prompts,
                                  generators=generators, device=device)
    return sampler(logits.to(device), meta)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_is_argmax_and_keeps_input(device) -> None:
    logits = torch.randn(5, 97)
    before = logits.clone()
    out = _run(logits, [SamplingParams(temperature=0)] * 5, device=device)
    assert out.sampled_token_ids.dtype == torch.int64
    assert torch.equal(out.sampled_token_ids.cpu(), logits.argmax(dim=1))
    assert out.logprobs_tensors is None
    half = _run(logits.half(), [SamplingParams(temperature=0)] * 5, device=device)
    assert torch.equal(half.sampled_token_ids.cpu(), logits.half().float().argmax(dim=1))
    # Penalties and temperature work on a copy.
    _run(logits, [SamplingParams(temperature=0.5, presence_penalty=1.0)] * 5,
         outputs=[[1, 2]] * 5, generators=None)
    assert torch.equal(logits, before)


def test_noise_seeds_keep_keys_and_advance_the_offset_or_draw_seeded_rows_fresh() -> None:
    noise = NoiseSeeds()
    cpu = torch.device("cpu")
    a, offset_a = noise(3, cpu, {})
    b, offset_b = noise(5, cpu, {})
    assert offset_b == offset_a + 1 and torch.equal(a, b[:3])  # same keys, a new counter offset
    assert len(set(b.tolist())) == 5
    grown, offset = noise(300, cpu, {})  # more rows than keys: new keys, the offset still moves
    assert grown.shape == (300,) and offset == offset_b + 1
    generator, reference = make_generator(5), make_generator(5)
    seeded, offset = noise(4, cpu, {2: generator})
    assert offset == 0  # fresh keys per call, the seeded row's from its own generator
    assert int(seeded[2]) == int(torch.empty(1, dtype=torch.int64).random_(generator=reference)[0])


@pytest.mark.gpu
@_CUDA
@pytest.mark.parametrize("params,written", [
    ([SamplingParams(temperature=0)] * 4, True),
    ([SamplingParams(temperature=0.8)] * 4, True),
    ([SamplingParams(temperature=0), SamplingParams(temperature=0.8)] * 2, False),
    ([SamplingParams(temperature=0.8, top_k=3)] * 4, False),
])
def test_single_kernel_paths_write_the_ids_into_sampled_host(params, written) -> None:
    logits = torch.randn(4, 3000, device="cuda")
    meta = SamplingMetadata.build(params, output_token_ids=[[] for _ in params], device="cuda")
    host = torch.full((4,), -1, dtype=torch.int64, pin_memory=True)
    out = sampler(logits, meta, sampled_host=host)
    torch.cuda.synchronize()
    if written:
        assert out.sampled_host is host and torch.equal(host, out.sampled_token_ids.cpu())
    else:
        assert out.sampled_host is None and host.tolist() == [-1] * 4


def test_greedy_rows_in_mixed_batch_use_penalized_argmax() -> None:
    logits = torch.zeros(3, 10)
    logits[:, 4] = 2.0
    logits[:, 6] = 1.5
    params = [SamplingParams(temperature=0, repetition_penalty=2.0),
              SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0)]
    out = _run(logits, params, outputs=[[4], [], [4]], prompts=[[1], [1], [1]])
    # Row 0: 2.0 / 2 = 1.0 < 1.5 -> token 6. Row 1: top-1 sampling = argmax. Row 2: plain.
    assert out.sampled_token_ids.tolist() == [6, 4, 4]


def test_min_tokens_blocks_stop_ids_until_met() -> None:
    logits = torch.zeros(2, 8)
    logits[:, 2] = 10.0  # eos is by far the most likely
    logits[:, 5] = 5.0
    p = SamplingParams(temperature=0, min_tokens=3)
    p.update_from_tokenizer(2)
    out = _run(logits, [p, p], outputs=[[7, 7], [7, 7, 7]])
    assert out.sampled_token_ids.tolist() == [5, 2]


def _reference_probs(logits: torch.Tensor, p: SamplingParams, prompt: list[int],
                     output: list[int]) -> torch.Tensor:
    """softmax after transformers' processors, in vLLM's order (1-row logits)."""
    x = logits.clone().unsqueeze(0)
    x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(
        torch.tensor([prompt + output]), x)
    for tok in set(output):
        x[0, tok] -= p.frequency_penalty * output.count(tok) + p.presence_penalty
    x = TemperatureLogitsWarper(p.temperature)(None, x)
    if p.top_k > 0:
        x = TopKLogitsWarper(p.top_k)(None, x)
    if p.top_p < 1:
        x = TopPLogitsWarper(p.top_p)(None, x)
    if p.min_p > 0:
        x = MinPLogitsWarper(p.min_p)(None, x)
    return x.softmax(dim=1)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("kwargs", [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.1),
    dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05, repetition_penalty=1.4,
         presence_penalty=0.3, frequency_penalty=0.2),
])
def test_sampling_distribution_matches_reference(kwargs, seeded: bool, device: str) -> None:
    torch.manual_seed(1234)
    vocab, n = 12, 6000
    base = torch.randn(vocab) * 1.5
    prompt, output = [0, 1, 3], [3, 5, 5]
    p = SamplingParams(seed=7 if seeded else None, **kwargs)
    gens = [make_generator(1000 + i, device=device) for i in range(n)] if seeded else None
    out = _run(base.expand(n, vocab).contiguous(), [p] * n, outputs=[output] * n,
               prompts=[prompt] * n, generators=gens, device=device)
    probs = _reference_probs(base, p, prompt, output)
    stat, dof, outside = chi_square(out.sampled_token_ids.cpu(), probs)
    assert outside == 0, "sampled a token the filters removed"
    if dof == 0:
        return
    assert stat < CHI2_999[dof], f"chi2={stat:.1f} dof={dof}"


def _step_logits(request: str, step: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, request)) * 1000 + step)
    return torch.randn(vocab, generator=g)


def _run_steps(order: list[str], params: dict[str, SamplingParams], device: str,
               steps: int = 6):
    vocab = 500
    gens = {r: make_generator(params[r].seed, device=device)
            for r in order if params[r].seed is not None}
    tokens: dict[str, list[int]] = {r: [] for r in order}
    for step in range(steps):
        logits = torch.stack([_step_logits(r, step, vocab) for r in order])
        rows = [params[r] for r in order]
        row_gens = {i: gens[r] for i, r in enumerate(order) if r in gens}
        out = _run(logits, rows, outputs=[tokens[r] for r in order], generators=row_gens,
                   device=device)
        for r, t in zip(order, out.sampled_token_ids.tolist()):
            tokens[r].append(t)
    return tokens


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_rows_reproducible_across_batch_composition(device: str) -> None:
    params = {"a": SamplingParams(seed=11, top_p=0.95), "b": SamplingParams(seed=22, top_k=50),
              "c": SamplingParams(), "d": SamplingParams(temperature=0)}
    first = _run_steps(["a", "b", "c", "d"], params, device)
    reordered = _run_steps(["d", "c", "b", "a"], params, device)
    alone = _run_steps(["a"], params, device)
    assert first["a"] == reordered["a"] == alone["a"]
    assert first["b"] == reordered["b"]
    assert first["a"] != first["b"]
    assert len(set(first["a"])) > 1  # the generator advances between steps


def test_logprobs_are_raw_log_softmax_with_ranks() -> None:
    torch.manual_seed(3)
    logits = torch.randn(4, 40)
    params = [SamplingParams(temperature=0.5, logprobs=3, presence_penalty=1.5),
              SamplingParams(temperature=0, logprobs=0),
              SamplingParams(temperature=2.0),
              SamplingParams(temperature=1.0, top_k=3, logprobs=1)]
    out = _run(logits, params, outputs=[[int(logits[0].argmax())], [], [], []])
    lt = out.logprobs_tensors
    raw = logits.log_softmax(dim=1)
    sampled = out.sampled_token_ids
    assert lt.logprob_token_ids.shape == (4, 4) and lt.logprobs.shape == (4, 4)
    assert torch.equal(lt.logprob_token_ids[:, 0], sampled)
    torch.testing.assert_close(lt.logprobs[:, 0], raw.gather(1, sampled[:, None])[:, 0])
    top = raw.topk(3, dim=1)
    assert torch.equal(lt.logprob_token_ids[:, 1:], top.indices)
    torch.testing.assert_close(lt.logprobs[:, 1:], top.values)
    order = raw.argsort(dim=1, descending=True)
    expected_ranks = [order[i].tolist().index(int(sampled[i])) + 1 for i in range(4)]
    assert lt.selected_token_ranks.tolist() == expected_ranks
    assert expected_ranks[1] == 1  # greedy picks the top token
