"""SamplingParams: how one request samples, with vLLM's field names, defaults and checks."""

from __future__ import annotations

import copy
import enum
import json as _json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("vllm_volta.sampling_params")

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
# Tiny positive temperatures overflow fp32 logits / T; vLLM raises them to this floor.
MIN_RANDOM_TEMPERATURE = 1e-2
# Largest `logprobs` / `prompt_logprobs` a request may ask for (vLLM's default max_logprobs).
MAX_LOGPROBS = 20


class SamplingType(enum.IntEnum):
    """How the sampler treats a row."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


def _range_error(name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"{name} must be {allowed}, got {value!r}.")


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}.")


def _token_bias(bias: Any) -> dict[int, float]:
    """logit_bias as {token id: finite float}; keys may be ints or integer strings (JSON)."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a mapping of token ids to numbers, got {bias!r}.")
    out = {}
    for key, value in bias.items():
        try:
            token = int(key) if isinstance(key, str) else key
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}.") from None
        _check_int("logit_bias key", token)
        if token < 0:
            raise _range_error("logit_bias key", "a non-negative token id", token)
        _check_number("logit_bias value", value)
        if not math.isfinite(value):
            raise _range_error("logit_bias value", "a finite number", value)
        out[token] = float(value)
    return out


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}.")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What a request's output must match (vLLM's names; exactly one field): a JSON schema
    (``json``, a dict or its text), any JSON object (``json_object``), a regular expression,
    one of the ``choice`` strings, or an EBNF ``grammar``."""

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError(f"structured_outputs must set exactly one of json, regex, choice, grammar, "
                             f"json_object; got {given or 'none'}.")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(f"structured_outputs json must be a JSON schema (dict or text), "
                             f"got {self.json!r}.")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs {name} must be a non-empty string, got {value!r}.")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError(f"structured_outputs choice must be a non-empty list of non-empty "
                                 f"strings, got {self.choice!r}.")
            object.__setattr__(self, "choice", tuple(self.choice))

    def key(self) -> tuple:
        """A hashable identity (compiled grammars are cached by it)."""
        schema = self.json if not isinstance(self.json, dict) else _json.dumps(self.json, sort_keys=True)
        return (schema, self.regex, self.choice, self.grammar, self.json_object)


@dataclass
class SamplingParams:
    """Sampling parameters of one request (vLLM's names, defaults and validation).

    temperature=0 is greedy; top_k 0 or -1 disables top-k (stored as 0); max_tokens=None
    lets the engine generate up to max_model_len; seed makes a request reproducible on its
    own, whatever else shares its batch.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    # Added to the logits of these token ids before sampling (OpenAI's logit_bias; JSON's
    # string keys are accepted), and vLLM's allowed_token_ids: sampling only among these.
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    # Constrained decoding (JSON schema, regex, choice, grammar); a dict of its fields works too.
    structured_outputs: StructuredOutputsParams | dict | None = None
    # Stop ids including the model's eos ids: masked out while min_tokens is unmet.
    _all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)
    _eos_token_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        # Normalize the forms vLLM accepts before checking ranges.
        if self.seed == -1:
            self.seed = None
        if self.top_k == -1:
            self.top_k = 0
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        if self.logit_bias is not None:
            self.logit_bias = _token_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as exc:
                raise ValueError(f"structured_outputs: {exc}") from None
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                    StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be StructuredOutputsParams or a dict, got "
                             f"{self.structured_outputs!r}.")
        # OpenAI clients send logprobs=True meaning "the sampled token only".
        if self.logprobs is True:
            self.logprobs = 0
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 0
        self._verify_args()
        if 0 < self.temperature < MIN_RANDOM_TEMPERATURE:
            logger.warning("temperature %s is below %s and may overflow; using %s.",
                           self.temperature, MIN_RANDOM_TEMPERATURE, MIN_RANDOM_TEMPERATURE)
            self.temperature = MIN_RANDOM_TEMPERATURE
        if self.temperature < SAMPLING_EPS:
            # Greedy ignores the filters; resetting them keeps the sampler's fast path.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify_args(self) -> None:
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p", "min_p"):
            _check_number(name, getattr(self, name))
        _check_int("n", self.n)
        if self.n < 1:
            raise _range_error("n", "at least 1", self.n)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise _range_error(name, "in [-2, 2]", value)
        if not self.repetition_penalty > 0.0:
            raise _range_error("repetition_penalty", "greater than 0", self.repetition_penalty)
        if not self.temperature >= 0.0:
            raise _range_error("temperature", "non-negative (0 = greedy)", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise _range_error("top_p", "in (0, 1]", self.top_p)
        _check_int("top_k", self.top_k)
        if self.top_k < 0:
            raise _range_error("top_k", "-1 or 0 (disabled) or at least 1", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise _range_error("min_p", "in [0, 1]", self.min_p)
        if self.seed is not None:
            _check_int("seed", self.seed)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise _range_error("max_tokens", "at least 1 (or None)", self.max_tokens)
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise _range_error("min_tokens", "at least 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _range_error("min_tokens", f"at most max_tokens={self.max_tokens}",
                               self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value)
                if not 0 <= value <= MAX_LOGPROBS:
                    raise _range_error(name, f"in [0, {MAX_LOGPROBS}] (or None)", value)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must hold non-empty strings, got {s!r}.")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t)
            if t < 0:
                raise _range_error("stop_token_ids", "non-negative token ids", t)
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True; use stop_token_ids instead.")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty (None allows every token).")
            for t in self.allowed_token_ids:
                _check_int("allowed_token_ids", t)
                if t < 0:
                    raise _range_error("allowed_token_ids", "non-negative token ids", t)

    @property
    def sampling_type(self) -> SamplingType:
        """GREEDY for temperature 0, else RANDOM_SEED if seeded, else RANDOM."""
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def has_penalties(self) -> bool:
        """Whether sampling reads the output so far (presence/frequency/repetition)."""
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)

    def reads_output_history(self, num_output_tokens: int) -> bool:
        """Whether the next token's sampling depends on the tokens generated so far: penalties,
        min_tokens not yet reached (stop ids are masked), or structured outputs (the grammar
        state)."""
        return (self.has_penalties or num_output_tokens < self.min_tokens
                or self.structured_outputs is not None)

    @property
    def all_stop_token_ids(self) -> set[int]:
        """stop_token_ids plus the model's eos ids (after update_from_tokenizer)."""
        return self._all_stop_token_ids

    @property
    def eos_token_ids(self) -> set[int]:
        """The model's eos ids that end generation unless ignore_eos is set."""
        return self._eos_token_ids

    @property
    def output_text_buffer_length(self) -> int:
        """Characters of streamed text to hold back: they may still start a stop string."""
        if self.stop and not self.include_stop_str_in_output:
            return max(len(s) for s in self.stop) - 1
        return 0

    def update_from_tokenizer(self, eos_token_id: int | Iterable[int] | None) -> None:
        """Record the model's eos id(s); called by the engine when the request is added.

        The eos ids join all_stop_token_ids (so min_tokens also holds eos back) even with
        ignore_eos, as in vLLM; whether eos ends generation is `is_stop_token`'s business.
        """
        if eos_token_id is None:
            return
        ids = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
        self._eos_token_ids |= ids
        self._all_stop_token_ids |= ids

    def is_stop_token(self, token_id: int) -> bool:
        """Whether sampling `token_id` finishes the request with finish_reason "stop"."""
        if token_id in self.stop_token_ids:
            return True
        return not self.ignore_eos and token_id in self._eos_token_ids

    def clone(self) -> SamplingParams:
        """A deep copy (the engine mutates its copy, never the user's object). Every field is
        a scalar, a string or a flat list or set of them, so copying the containers copies it
        all (copy.deepcopy's generic walk took ~0.1 ms, once per request)."""
        new = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, (list, set, dict)):
                setattr(new, name, value.copy())
        return new

    def __repr__(self) -> str:
        return (f"SamplingParams(n={self.n}, presence_penalty={self.presence_penalty}, "
                f"frequency_penalty={self.frequency_penalty}, "
                f"repetition_penalty={self.repetition_penalty}, "
                f"temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k}, "
                f"min_p={self.min_p}, seed={self.seed}, stop={self.stop}, "
                f"stop_token_ids={self.stop_token_ids}, "
                f"include_stop_str_in_output={self.include_stop_str_in_output}, "
                f"ignore_eos={self.ignore_eos}, max_tokens={self.max_tokens}, "
                f"min_tokens={self.min_tokens}, logprobs={self.logprobs}, "
                f"prompt_logprobs={self.prompt_logprobs}, "
                f"skip_special_tokens={self.skip_special_tokens}, "
                f"spaces_between_special_tokens={self.spaces_between_special_tokens})")


@dataclass
class BeamSearchParams:
    """LLM.beam_search's parameters (vLLM's names and defaults)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            _check_int(name, value)
            if value < 1:
                raise _range_error(name, "at least 1", value)
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise _range_error("temperature", "non-negative", self.temperature)
        _check_number("length_penalty", self.length_penalty)
