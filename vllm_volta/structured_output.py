"""Structured outputs (constrained decoding) with xgrammar, as vLLM's default backend.

A request's StructuredOutputsParams compile (cached) into a grammar over the tokenizer's
vocabulary; each sequence gets a matcher that follows its tokens. Before each sample the
matchers of the step's constrained rows fill a bitmask of the tokens that may come next, the
sampler sets every other logit to -inf (sample/token_bias.apply_bitmask), and the scheduler
feeds each sampled token back (``accept``, in update_from_output); a sequence whose grammar is
complete stops there. Those sequences read their token
history, so async scheduling waits for each of their tokens before the next step.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from vllm_volta.sampling_params import StructuredOutputsParams
from vllm_volta.structured_output_checks import check_regex_anchors, check_schema_enforceable

_CACHE_SIZE = 128  # compiled grammars kept per process


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured_outputs need the xgrammar package (pip install xgrammar)") from None
    return xgrammar


class StructuredOutputManager:
    """Compiles StructuredOutputsParams for one tokenizer and model vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler: Any = None
        self._compiled: dict[tuple, Any] = {}

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar; ValueError naming structured_outputs for what does not compile."""
        key = params.key()
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compile(params)
            if len(self._compiled) >= _CACHE_SIZE:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = compiled
        return compiled

    def matcher(self, params: StructuredOutputsParams) -> Any:
        return _xgrammar().GrammarMatcher(self.compile(params))

    def _compile(self, params: StructuredOutputsParams) -> Any:
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer (skip_tokenizer_init is set)")
        xgr = _xgrammar()
        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids or None)
            self._compiler = xgr.GrammarCompiler(info)
        compiler = self._compiler
        try:
            if params.json is not None:
                schema = json.loads(params.json) if isinstance(params.json, str) else params.json
                check_schema_enforceable(schema)
                compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            elif params.json_object:
                compiled = compiler.compile_builtin_json_grammar()
            elif params.regex is not None:
                check_regex_anchors(params.regex)
                compiled = compiler.compile_regex(params.regex)
            elif params.choice is not None:
                compiled = compiler.compile_grammar("root ::= " + " | ".join(
                    json.dumps(c, ensure_ascii=False) for c in params.choice))
            else:
                compiled = compiler.compile_grammar(params.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"structured_outputs: {_first_line(exc)}") from None
        self._check_satisfiable(compiled)
        return compiled

    def _check_satisfiable(self, compiled: Any) -> None:
        """A grammar that allows no first token and is not complete can never finish (an
        empty character class, a rule that only recurses): refuse it instead of sampling
        from an all -inf row."""
        matcher = _xgrammar().GrammarMatcher(compiled)
        if matcher.is_terminated():
            return
        bitmask = fill_bitmask([matcher], self.vocab_size)
        if not bool(bitmask.any()):
            raise ValueError("structured_outputs: the constraint can never be satisfied "
                             "(no output matches it)")


def accept(matcher: Any, token_ids: Sequence[int]) -> bool:
    """Feed sampled tokens to a sequence's matcher; True when its grammar is complete."""
    for token in token_ids:
        if matcher.is_terminated() or not matcher.accept_token(token):
            return True
    return matcher.is_terminated()


def fill_bitmask(matchers: Sequence[Any], vocab_size: int) -> torch.Tensor:
    """[len(matchers), ceil(vocab / 32)] int32 on the CPU: bit t of row r set when token t may
    come next for matcher r."""
    xgr = _xgrammar()
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    for row, matcher in enumerate(matchers):
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
