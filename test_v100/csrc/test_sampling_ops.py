"""gumbel_sample (CUDA kernel): its draws follow softmax(logits / T) (chi-square against the
float64 softmax), never pick masked tokens, depend only on each row's seed and logits;
greedy_sample equals torch.argmax (ties to the lowest index); and their argument checks
(Meta kernels: run on CPU too)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from test_v100.chi_square import CHI2_999, chi_square
from vllm_volta import _custom_ops as ops

from .op_cases import requires_gpu


def _sample(logits: torch.Tensor, temperature: float | torch.Tensor, seeds: torch.Tensor,
            seed_offset: int = 0) -> torch.Tensor:
    rows = logits.shape[0]
    if not isinstance(temperature, torch.Tensor):
        temperature = torch.full((rows,), temperature, dtype=torch.float32, device=logits.device)
    out = torch.full((rows,), -7, dtype=torch.int64, device=logits.device)
    ops.gumbel_sample(out, logits, temperature, seeds, seed_offset=seed_offset)
    return out


def _seeds(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2 ** 63), 2 ** 63 - 1, (n,), generator=g, dtype=torch.int64).cuda()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_draws_follow_softmax_of_logits_over_temperature(dtype, temperature):
    torch.manual_seed(0)
    vocab, n = 12, 8000
    base = (torch.randn(vocab) * 1.5).to(dtype)
    samples = _sample(base.expand(n, vocab).contiguous().cuda(), temperature, _seeds(n))
    probs = (base.double() / temperature).softmax(0)
    stat, dof, _ = chi_square(samples, probs)
    assert stat < CHI2_999[dof], f"chi2={stat:.1f} dof={dof}"


@pytest.mark.gpu
@requires_gpu
def test_masked_tokens_never_drawn_across_vocab_spans():
    # Live tokens in three different 8192-entry spans (the kernel's blocks), the last one at the
    # ragged end; every other logit is -inf. Rows have strided storage (a slice of a wider buffer).
    vocab, n = 20001, 6000
    live = torch.tensor([3, 8191, 8192, 16500, 20000])
    values = torch.tensor([0.5, -0.3, 1.0, 0.0, 0.8])
    row = torch.full((vocab,), float("-inf"))
    row[live] = values
    wide = torch.zeros(n, vocab + 7, dtype=torch.float16)
    wide[:, :vocab] = row.half()
    samples = _sample(wide.cuda()[:, :vocab], 1.0, _seeds(n, 1)).cpu()
    assert torch.isin(samples, live).all()
    remap = torch.zeros(vocab, dtype=torch.int64)
    remap[live] = torch.arange(len(live))
    stat, dof, _ = chi_square(remap[samples], values.half().double().softmax(0))
    assert stat < CHI2_999[dof], f"chi2={stat:.1f} dof={dof}"


@pytest.mark.gpu
@requires_gpu
def test_a_rows_draw_depends_only_on_its_seed_and_logits():
    torch.manual_seed(2)
    logits = torch.randn(64, 50000, dtype=torch.float16, device="cuda")
    seeds = _seeds(64, 3)
    temperature = torch.rand(64, device="cuda") + 0.5
    full = _sample(logits, temperature, seeds)
    assert torch.equal(full, _sample(logits, temperature, seeds))  # same seeds, same draws
    picked = torch.tensor([40, 7, 21], device="cuda")
    assert torch.equal(full[picked], _sample(logits[picked], temperature[picked], seeds[picked]))
    other = _sample(logits, temperature, _seeds(64, 4))
    assert not torch.equal(full, other)
    assert len(set(full.tolist())) > 32  # rows with different logits draw different tokens


def _philox4x32_10(counters: np.ndarray, seed: int, offset: int = 0) -> np.ndarray:
    """Philox4x32-10 of counters (c, offset low word, offset high word, 0) under the 64-bit key
    `seed`: [n, 4] uint32 words."""
    m0, m1, w0, w1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), 0x9E3779B9, 0xBB67AE85
    mask = np.uint64(0xFFFFFFFF)
    x = counters.astype(np.uint64)
    w = np.zeros_like(x)
    y = np.full_like(x, offset & 0xFFFFFFFF)
    z = np.full_like(x, (offset >> 32) & 0xFFFFFFFF)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = m0 * x, m1 * z
        x, y, z, w = ((p1 >> np.uint64(32)) ^ y ^ np.uint64(k0), p1 & mask,
                      (p0 >> np.uint64(32)) ^ w ^ np.uint64(k1), p0 & mask)
        k0, k1 = (k0 + w0) & 0xFFFFFFFF, (k1 + w1) & 0xFFFFFFFF
    return np.stack([x, y, z, w], axis=1).astype(np.uint32)


def test_reference_philox_matches_the_published_known_answer():
    # Random123's known-answer vector for Philox4x32-10, counter 0 and key 0.
    words = _philox4x32_10(np.array([0]), 0)[0]
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def _reference_keys(logits: torch.Tensor, temperature: float, seed: int, offset: int = 0) -> np.ndarray:
    """float64 logits / T + Gumbel noise of the documented stream: entry i takes word i % 4 of
    Philox(counter (i // 4, offset)) keyed by the row's seed, v = (word + 1/2) / 2^32,
    G = -log(-log(1 - v))."""
    vocab = logits.shape[0]
    words = _philox4x32_10(np.arange((vocab + 3) // 4), seed % 2 ** 64, offset).reshape(-1)[:vocab]
    v = (words.astype(np.float64) + 0.5) / 2.0 ** 32
    return logits.double().numpy() / temperature - np.log(-np.log1p(-v))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("offset", [0, 2 ** 40 + 5])
def test_draw_is_the_argmax_of_the_documented_noise_stream(dtype, offset):
    # Rows of 20003 entries (three 8192-entry spans, a ragged end), in an aligned buffer (16-byte
    # vector loads) and shifted by one entry (entry-by-entry loads): both draw the token whose
    # float64 reference key is the largest, up to the kernel's fast-log error; at a counter
    # offset with both 32-bit words set, the stream is the offset's.
    torch.manual_seed(3)
    rows, vocab, temperature = 24, 20003, 0.8
    logits = (torch.randn(rows, vocab) * 2).to(dtype)
    seeds = _seeds(rows, 9)
    buffer = torch.zeros(rows, vocab + 8, dtype=dtype)
    buffer[:, :vocab] = logits
    aligned = _sample(buffer.cuda()[:, :vocab], temperature, seeds, offset).cpu()
    buffer = torch.zeros(rows, vocab + 8, dtype=dtype)
    buffer[:, 1:vocab + 1] = logits
    shifted = _sample(buffer.cuda()[:, 1:vocab + 1], temperature, seeds, offset).cpu()
    assert torch.equal(aligned, shifted)
    for row in range(rows):
        keys = _reference_keys(logits[row], temperature, int(seeds[row]), offset)
        assert keys[int(aligned[row])] >= keys.max() - 1e-4, f"row {row}"
    if offset:  # another offset, another draw (24 rows of ~20k near-uniform tokens)
        assert not torch.equal(aligned, _sample(buffer.cuda()[:, 1:vocab + 1], temperature, seeds).cpu())


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", ["greedy", "gumbel"])
def test_ids_are_written_into_pinned_host_memory_too(kind):
    # sampled_host receives the same ids the device tensor gets, readable once the stream has run
    # the kernel (no copy launched); a pageable CPU tensor is refused with a clear error.
    torch.manual_seed(8)
    rows, vocab = 5, 30001
    logits = torch.randn(rows, vocab, dtype=torch.float16, device="cuda")
    out = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
    host = torch.full((rows,), -7, dtype=torch.int64, pin_memory=True)
    temperature = torch.full((rows,), 0.9, device="cuda")

    def run(sampled_host):
        if kind == "greedy":
            ops.greedy_sample(out, logits, sampled_host=sampled_host)
        else:
            ops.gumbel_sample(out, logits, temperature, _seeds(rows, 4), seed_offset=3,
                              sampled_host=sampled_host)

    run(host)
    torch.cuda.synchronize()
    assert torch.equal(host, out.cpu())
    if kind == "greedy":
        assert torch.equal(out, logits.argmax(dim=1))
    with pytest.raises(RuntimeError, match=re.escape(
            f"{kind}_sample: 'sampled_host' must be pinned host memory (pin_memory=True)")):
        run(torch.zeros(rows, dtype=torch.int64))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 7, 8192, 8193, 128256])
def test_greedy_sample_equals_argmax(dtype, vocab):
    torch.manual_seed(5)
    wide = torch.randn(9, vocab + 3, device="cuda").to(dtype)
    logits = wide[:, :vocab]  # strided rows
    if vocab > 8192:  # ties across the kernel's vocabulary spans: the lowest index wins
        top = logits.max() + 1
        logits[0, 8191] = logits[0, vocab - 1] = top
        logits[1, 5] = logits[1, 8192] = top
    out = torch.full((9,), -7, dtype=torch.int64, device="cuda")
    ops.greedy_sample(out, logits)
    assert torch.equal(out, logits.argmax(dim=1))


@pytest.mark.gpu
@requires_gpu
def test_greedy_sample_skips_nan_and_handles_all_masked_rows():
    logits = torch.full((2, 10000), float("-inf"), dtype=torch.float16, device="cuda")
    logits[0, 9000] = 1.0
    logits[0, 3] = float("nan")
    out = torch.full((2,), -7, dtype=torch.int64, device="cuda")
    ops.greedy_sample(out, logits)
    assert out.tolist() == [9000, 0]  # an all -inf row has the first index (as torch.argmax)


@pytest.mark.gpu
@requires_gpu
def test_workspace_is_left_zero_and_reused_across_calls_and_row_counts():
    # A caller's workspace (zeros, extra entries past 2 per row) stays zero after each call, so
    # calls of other row counts, greedy and random alike, keep matching argmax and the seeded
    # draw of a fresh zeroed workspace; the default one (per stream) does the same.
    torch.manual_seed(6)
    workspace = torch.zeros(2 * 40 + 3, dtype=torch.int64, device="cuda")
    for rows, vocab in ((3, 9000), (40, 151936), (1, 17), (40, 20003)):
        logits = torch.randn(rows, vocab, dtype=torch.float16, device="cuda")
        out = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
        ops.greedy_sample(out, logits, workspace)
        assert torch.equal(out, logits.argmax(dim=1))
        assert not workspace.any()
        temperature = torch.full((rows,), 0.7, device="cuda")
        seeds = _seeds(rows, rows)
        ops.gumbel_sample(out, logits, temperature, seeds, workspace)
        assert not workspace.any()
        fresh = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
        ops.gumbel_sample(fresh, logits, temperature, seeds, torch.zeros(2 * rows, dtype=torch.int64,
                                                                         device="cuda"))
        assert torch.equal(out, fresh)
        assert torch.equal(_sample(logits, temperature, seeds), fresh)  # the default workspace
        assert not ops.sample_workspace(logits).any()


def _meta_args(**overrides):
    meta = dict(device="meta")
    args = dict(sampled=torch.empty(3, dtype=torch.int64, **meta),
                logits=torch.empty(3, 100, dtype=torch.float16, **meta),
                temperature=torch.empty(3, dtype=torch.float32, **meta),
                seeds=torch.empty(3, dtype=torch.int64, **meta),
                workspace=torch.empty(6, dtype=torch.int64, **meta))
    args.update(overrides)
    return args


BAD_ARGS = [
    (dict(logits=torch.empty(3, 100, dtype=torch.int32, device="meta")), "'logits' must be float32, float16"),
    (dict(logits=torch.empty(300, dtype=torch.float16, device="meta")), "'logits' must be [num_rows, vocab_size]"),
    (dict(logits=torch.empty(100, 3, dtype=torch.float16, device="meta").t()),
     "'logits' must be contiguous in its last dimension"),
    (dict(logits=torch.empty(3, 1 << 30, dtype=torch.float16, device="meta")), "vocab_size must be in [1, 2^30)"),
    (dict(sampled=torch.empty(3, dtype=torch.int32, device="meta")), "'sampled' must be int64"),
    (dict(temperature=torch.empty(4, dtype=torch.float32, device="meta")),
     "'temperature' must be 1-D with one entry per row of 'logits' (3)"),
    (dict(temperature=torch.empty(3, dtype=torch.float16, device="meta")), "'temperature' must be float32"),
    (dict(workspace=torch.empty(5, dtype=torch.int64, device="meta")),
     "'workspace' must have at least 2 entries per row of 'logits' (6), got 5"),
    (dict(workspace=torch.empty(6, dtype=torch.int32, device="meta")),
     "'workspace' must be a contiguous 1-D int64 tensor"),
    (dict(seeds=torch.empty(3, dtype=torch.float32, device="meta")), "'seeds' must be int64"),
    (dict(sampled_host=torch.empty(3, dtype=torch.int64, device="meta")),
     "'sampled_host' must be a (pinned) CPU tensor"),
    (dict(sampled_host=torch.empty(4, dtype=torch.int64)),
     "'sampled_host' must be a contiguous 1-D int64 tensor with one entry per row of 'logits' (3)"),
    (dict(sampled_host=torch.empty(3, dtype=torch.int32)),
     "'sampled_host' must be a contiguous 1-D int64 tensor"),
]


@pytest.mark.parametrize("overrides,message", BAD_ARGS)
def test_bad_input_is_a_clear_error(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(f"gumbel_sample: {message}")):
        torch.ops._C.gumbel_sample(**_meta_args(**overrides))


def test_valid_meta_args_pass():
    torch.ops._C.gumbel_sample(**_meta_args())
    torch.ops._C.gumbel_sample(**_meta_args(sampled_host=torch.empty(3, dtype=torch.int64)), seed_offset=-5)
    torch.ops._C.greedy_sample(torch.empty(3, dtype=torch.int64, device="meta"),
                               torch.empty(3, 100, dtype=torch.float16, device="meta"),
                               torch.empty(6, dtype=torch.int64, device="meta"))


GREEDY_ARGS = ("sampled", "logits", "workspace", "sampled_host")


@pytest.mark.parametrize("overrides,message", [case for case in BAD_ARGS if set(case[0]) <= set(GREEDY_ARGS)])
def test_greedy_sample_bad_input_is_a_clear_error(overrides, message):
    args = {k: v for k, v in _meta_args(**overrides).items() if k in GREEDY_ARGS}
    with pytest.raises(RuntimeError, match=re.escape(f"greedy_sample: {message}")):
        torch.ops._C.greedy_sample(**args)


def test_greedy_sample_needs_one_output_per_row():
    with pytest.raises(RuntimeError, match=re.escape(
            "greedy_sample: 'sampled' must be 1-D with one entry per row of 'logits' (3)")):
        torch.ops._C.greedy_sample(torch.empty(4, dtype=torch.int64, device="meta"),
                                   torch.empty(3, 100, dtype=torch.float16, device="meta"),
                                   torch.empty(6, dtype=torch.int64, device="meta"))
