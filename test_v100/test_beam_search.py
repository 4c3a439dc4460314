"""LLM.beam_search (vllm_volta/beam_search.py) against transformers' beam search."""
from __future__ import annotations

import pytest

from test_v100.worker.tiny_models import random_prompts, save_tiny_model
from vllm_volta import LLM


def test_beam_search_matches_transformers(tmp_path):
    """Beams of one length (ignore_eos): the same sequences, in the same order, as transformers'
    num_beams search, with cumulative logprobs of the model's own distribution."""
    import torch

    from vllm_volta.sampling_params import BeamSearchParams

    hf = save_tiny_model(tmp_path, "llama")
    # float32 on a GPU too (its default would be float16), for the 1e-3 logprob check.
    llm = LLM(str(tmp_path), cpu_kvcache_space=0.01, max_model_len=64, skip_tokenizer_init=True, dtype="float32")
    prompts = random_prompts(2, 4, 9, seed=11)
    outs = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), num_beams=3, num_return_sequences=3, do_sample=False,
                              max_new_tokens=6, min_new_tokens=6, eos_token_id=None, pad_token_id=0)
        assert [s.tokens for s in out.sequences] == ref.tolist()
        for seq in out.sequences:
            with torch.no_grad():
                logp = torch.log_softmax(hf(torch.tensor([seq.tokens])).logits[0], dim=-1)
            want = sum(logp[i - 1, seq.tokens[i]].item() for i in range(len(prompt), len(seq.tokens)))
            assert seq.cum_logprob == pytest.approx(want, abs=1e-3)
            assert seq.finish_reason == "length"
    with pytest.raises(ValueError, match=r"beam_width: 11 needs 22 logprobs"):
        llm.beam_search(prompts, BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="beam_width must be at least 1"):
        BeamSearchParams(beam_width=0, max_tokens=2)


def test_beam_search_sets_finished_beams_aside(tmp_path):
    """With an eos the best beam picks, that beam finishes there ("stop") and keeps its place;
    the others run on. Beams are ranked by cumulative logprob / length ** length_penalty."""
    import json

    from vllm_volta.beam_search import beam_score
    from vllm_volta.sampling_params import BeamSearchParams

    save_tiny_model(tmp_path, "llama")
    prompt = random_prompts(1, 6, 6, seed=12)[0]
    probe = LLM(str(tmp_path), cpu_kvcache_space=0.01, max_model_len=64, skip_tokenizer_init=True)
    best = probe.beam_search([prompt], BeamSearchParams(2, 5, ignore_eos=True))[0].sequences[0]
    eos = best.tokens[len(prompt) + 1]  # the best beam's second token
    del probe
    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    llm = LLM(str(tmp_path), cpu_kvcache_space=0.01, max_model_len=64, skip_tokenizer_init=True)
    for penalty in (1.0, 0.0):
        seqs = llm.beam_search([prompt], BeamSearchParams(2, 5, length_penalty=penalty))[0].sequences
        stopped = [s for s in seqs if s.finish_reason == "stop"]
        assert stopped and all(s.tokens[-1] == eos and len(s.tokens) < len(prompt) + 5 for s in stopped)
        assert all(s.finish_reason == "length" and len(s.tokens) == len(prompt) + 5
                   for s in seqs if s not in stopped)
        scores = [beam_score(s, {eos}, penalty) for s in seqs]
        assert scores == sorted(scores, reverse=True)
