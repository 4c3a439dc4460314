"""A request's input checks and tokenization, before it reaches the scheduler.

LLMEngine runs them in add_request; with the engine core in a process of its own
(core_process.py) the server process runs them too, so bad input fails at once, on the caller's
side, without a round trip to the core.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vllm_volta.pooling_params import PoolingParams
from vllm_volta.sampling_params import SamplingParams
from vllm_volta.structured_output import StructuredOutputManager

PromptInput = str | list[int] | Mapping[str, Any]


class InputProcessor:
    """Turns (prompt, params) into (prompt text, prompt token ids, params); ValueError, naming
    the field and what is allowed, for bad input."""

    def __init__(self, model_config: Any, tokenizer: Any, stop_token_ids: Iterable[int] = ()) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        # Compiles (and caches) structured-output grammars: a request's that does not compile
        # is refused here.
        self.structured = StructuredOutputManager(tokenizer, model_config.get_vocab_size(), stop_token_ids)

    def process(self, prompt: PromptInput, params: SamplingParams | PoolingParams | None
                ) -> tuple[str | None, list[int], SamplingParams | PoolingParams]:
        if params is None:
            params = SamplingParams()
        if not isinstance(params, (SamplingParams, PoolingParams)):
            raise ValueError(f"params must be SamplingParams or PoolingParams, got {type(params).__name__}")
        prompt_text, token_ids = self.tokenize(prompt)
        if isinstance(params, PoolingParams):
            params.verify(self.model_config.text_config.hidden_size)
            self.validate(token_ids, params.sampling_params())
        else:
            self.validate(token_ids, params)
        return prompt_text, token_ids, params

    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self.tokenize(list(prompt["prompt_token_ids"]))[1]
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
            raise ValueError("prompt dict needs a 'prompt' or 'prompt_token_ids' key")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: text prompts need a tokenizer (skip_tokenizer_init "
                                 "is set); pass prompt_token_ids")
            return prompt, list(self.tokenizer.encode(prompt))
        # Element types checked once each (map runs in C): ints, not bools.
        if isinstance(prompt, (list, tuple)) and all(
                issubclass(t, int) and t is not bool for t in set(map(type, prompt))):
            return None, list(prompt)
        raise ValueError(f"prompt must be a string, a list of token ids or a dict, "
                         f"got {type(prompt).__name__}")

    def validate(self, token_ids: list[int], params: SamplingParams) -> None:
        mc = self.model_config
        if not token_ids:
            raise ValueError("prompt must not be empty (0 tokens)")
        if len(token_ids) > mc.max_model_len:
            raise ValueError(f"prompt length {len(token_ids)} exceeds max_model_len "
                             f"{mc.max_model_len}: the prompt must have at most "
                             f"{mc.max_model_len} tokens")
        vocab = mc.get_vocab_size()
        if min(token_ids) < 0 or max(token_ids) >= vocab:
            bad = next(t for t in token_ids if not 0 <= t < vocab)
            raise ValueError(f"prompt_token_ids: token id {bad} is outside the vocabulary "
                             f"[0, {vocab})")
        for name, ids in (("logit_bias", params.logit_bias or ()),
                          ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise ValueError(f"{name}: token id {bad} is outside the vocabulary [0, {vocab})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > mc.max_logprobs:
                raise ValueError(f"{name}={value} exceeds max_logprobs={mc.max_logprobs}; "
                                 f"allowed range is [0, {mc.max_logprobs}]")
        if params.structured_outputs is not None:
            self.structured.compile(params.structured_outputs)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; use stop_token_ids")
