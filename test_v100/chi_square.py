"""Pearson's chi-square of sampled token ids against expected probabilities, for the sampling
tests (the seeds are fixed, so the tests that use it are deterministic)."""

from __future__ import annotations

import torch

# chi-square 0.999 quantiles by degrees of freedom.
CHI2_999 = {1: 10.8, 2: 13.8, 3: 16.3, 4: 18.5, 5: 20.5, 6: 22.5, 7: 24.3, 8: 26.1, 9: 27.9,
            10: 29.6, 11: 31.3}


def chi_square(samples: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, int]:
    """(statistic over the tokens of nonzero probability, its degrees of freedom, samples of
    tokens whose probability is zero)."""
    counts = torch.bincount(samples.cpu(), minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    support = expected > 0
    stat = float((((counts - expected) ** 2)[support] / expected[support]).sum())
    return stat, int(support.sum()) - 1, int(counts[~support].sum())
