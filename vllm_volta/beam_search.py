"""Beam search over the engine (vLLM's ``LLM.beam_search``).

Each step asks the engine for one token of every live beam with its 2 x beam_width most likely
next tokens (logprobs); every beam's candidates compete, per prompt, for the beam_width places of
the next step by cumulative logprob, and a candidate ending in eos is set aside as finished
(unless ignore_eos). At the end the finished and live beams are ranked by
cumulative logprob / length ** length_penalty (length: all tokens, prompt included, without a
final eos), as vLLM ranks them. The prefix cache keeps each step's prefill to the last block.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_volta.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from vllm_volta.entrypoints.llm import LLM


@dataclass
class BeamSearchSequence:
    """One beam: ``tokens`` = prompt + generated ids; ``text`` decodes all of them."""

    tokens: list[int]
    logprobs: list[dict[int, Any]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(seq: BeamSearchSequence, eos_token_ids: set[int], length_penalty: float) -> float:
    length = len(seq.tokens) - (seq.tokens[-1] in eos_token_ids)
    return seq.cum_logprob / (length ** length_penalty)


def beam_search(llm: LLM, prompts: list[list[int]], params: BeamSearchParams) -> list[BeamSearchOutput]:
    width = params.beam_width
    max_logprobs = llm.llm_engine.model_config.max_logprobs
    if 2 * width > max_logprobs:
        raise ValueError(f"beam_width: {width} needs {2 * width} logprobs per step, more than "
                         f"max_logprobs={max_logprobs}; allowed beam_width is [1, {max_logprobs // 2}]")
    tokenizer = llm.get_tokenizer()
    eos = set() if params.ignore_eos else set(llm.llm_engine.eos_token_ids)
    step_params = SamplingParams(max_tokens=1, logprobs=2 * width, temperature=params.temperature,
                                 ignore_eos=params.ignore_eos, detokenize=False)
    live = [[BeamSearchSequence(list(p))] for p in prompts]
    done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    for _ in range(params.max_tokens):
        flat = [beam for beams in live for beam in beams]
        if not flat:
            break
        outputs = iter(llm.generate([beam.tokens for beam in flat], step_params, use_tqdm=False))
        for i, beams in enumerate(live):
            candidates = []
            for beam in beams:
                out = next(outputs)
                if out.error:
                    raise ValueError(f"beam search: {out.error}")
                step = out.outputs[0].logprobs[0]
                for token, lp in step.items():
                    candidates.append(BeamSearchSequence(beam.tokens + [token], beam.logprobs + [step],
                                                         beam.cum_logprob + lp.logprob))
            candidates.sort(key=lambda c: c.cum_logprob, reverse=True)
            live[i] = []
            for cand in candidates[:width]:
                if cand.tokens[-1] in eos:
                    cand.finish_reason = "stop"
                    done[i].append(cand)
                else:
                    live[i].append(cand)
    results = []
    for beams, finished in zip(live, done):
        for beam in beams:
            beam.finish_reason = "length"
        ranked = sorted(finished + beams, key=lambda b: beam_score(b, eos, params.length_penalty),
                        reverse=True)[:width]
        for beam in ranked:
            if tokenizer is not None:
                keep = beam.tokens if params.include_stop_str_in_output or beam.finish_reason != "stop" \
                    else beam.tokens[:-1]
                beam.text = tokenizer.decode(keep, skip_special_tokens=True)
        results.append(BeamSearchOutput(ranked))
    return results
