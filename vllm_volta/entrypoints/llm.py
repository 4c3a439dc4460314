"""LLM: vLLM's offline API (generate / chat) on top of LLMEngine."""
from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_volta.beam_search import BeamSearchOutput, beam_search
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.input_processor import PromptInput
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from vllm_volta.pooling_params import PoolingParams
from vllm_volta.sampling_params import BeamSearchParams, SamplingParams

Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """An offline engine: `LLM(model).generate(prompts, sampling_params)`.

    `model=None` serves the default model (SmolLM2-135M-Instruct). Extra keyword
    arguments are EngineArgs fields (e.g. block_size, cpu_kvcache_space, load_format).
    """

    def __init__(self, model: str | None = None, tokenizer: str | None = None,
                 dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 gpu_memory_utilization: float = 0.9, enable_prefix_caching: bool = True,
                 enforce_eager: bool = False, tensor_parallel_size: int = 1,
                 trust_remote_code: bool = False, load_format: str = "auto",
                 **kwargs: Any) -> None:
        fields = set(EngineArgs.__dataclass_fields__)
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise ValueError(f"unknown LLM argument(s) {unknown}; allowed: {sorted(fields)}")
        kwargs.setdefault("disable_log_stats", True)  # offline: a progress bar, not log lines
        engine_args = EngineArgs(
            model=None if model is None else os.fspath(model), tokenizer=tokenizer, dtype=dtype,
            seed=seed, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching, enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size, trust_remote_code=trust_remote_code,
            load_format=load_format, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        # The model's recommended sampling defaults (generation_config), read once.
        self._default_sampling = self.llm_engine.model_config.get_diff_sampling_param()
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    # ---- generate -------------------------------------------------------------------
    def generate(self, prompts: PromptInput | Sequence[PromptInput],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order.

        Prompts are strings, token-id lists, or dicts with "prompt" / "prompt_token_ids".
        A prompt the engine rejects (e.g. longer than max_model_len) yields a finished
        RequestOutput with `error` set and finish_reason "error"; the others still run.
        """
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        return self._run_requests(prompt_list, self._params_list(sampling_params, len(prompt_list)), use_tqdm)

    def embed(self, prompts: PromptInput | Sequence[PromptInput],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """The embedding of every prompt (the final hidden state of its last token, normalized
        unless ``normalize=False``), in input order. A prompt the engine rejects yields an
        output with ``error`` set and ``outputs`` None."""
        prompt_list = _as_prompt_list(prompts)
        params = pooling_params if pooling_params is not None else PoolingParams()
        params_list = [params] * len(prompt_list) if isinstance(params, PoolingParams) else list(params)
        if len(params_list) != len(prompt_list):
            raise ValueError(f"pooling_params: got {len(params_list)} for {len(prompt_list)} prompts; "
                             f"pass one PoolingParams or one per prompt")
        return [EmbeddingRequestOutput(out.request_id, None if out.embedding is None else EmbeddingOutput(out.embedding),
                                       out.prompt_token_ids, out.finished, out.error)
                for out in self._run_requests(prompt_list, params_list, use_tqdm)]

    def _run_requests(self, prompt_list: list[PromptInput], params_list: list[SamplingParams | PoolingParams],
                      use_tqdm: bool) -> list[RequestOutput]:
        request_ids, results = [], {}
        for prompt, params in zip(prompt_list, params_list):
            request_id = str(next(self._request_counter))
            request_ids.append(request_id)
            try:
                self.llm_engine.add_request(request_id, prompt, params)
            except ValueError as e:
                results[request_id] = _error_output(request_id, prompt, params, str(e))
        self._run_engine(results, len(request_ids), use_tqdm)
        return [results[rid] for rid in request_ids]

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() uses without sampling_params: vLLM's defaults, or the model's
        generation_config.json recommendations (generation_config="auto", the default)."""
        return SamplingParams(**self._default_sampling)

    @staticmethod
    def _params_list(sampling_params: SamplingParams | Sequence[SamplingParams],
                     num_prompts: int) -> list[SamplingParams]:
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        params = list(sampling_params)
        if len(params) != num_prompts:
            raise ValueError(f"sampling_params: got {len(params)} for {num_prompts} prompts; "
                             f"pass one SamplingParams or one per prompt")
        return params

    def _run_engine(self, results: dict[str, RequestOutput], total: int, use_tqdm: bool) -> None:
        engine = self.llm_engine
        pbar = None
        if use_tqdm and total:
            from tqdm.auto import tqdm
            pbar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True,
                        initial=len(results))
        try:
            while engine.has_unfinished_requests():
                for out in engine.step(finished_only=True):
                    results[out.request_id] = out
                    if pbar is not None:
                        pbar.update(1)
        except BaseException:
            # Leave the engine clean for the next call (e.g. after Ctrl-C).
            engine.abort_all_requests()
            raise
        finally:
            if pbar is not None:
                pbar.close()

    # ---- beam search ------------------------------------------------------------------
    def beam_search(self, prompts: PromptInput | Sequence[PromptInput],
                    params: BeamSearchParams) -> list[BeamSearchOutput]:
        """vLLM's beam search (vllm_volta/beam_search.py); outputs in input order, each with
        its beams best first."""
        ids = []
        for prompt in _as_prompt_list(prompts):
            _, token_ids = self.llm_engine.input_processor.tokenize(prompt)
            ids.append(token_ids)
        return beam_search(self, ids, params)

    # ---- chat -------------------------------------------------------------------------
    def chat(self, messages: Conversation | Sequence[Conversation],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: list[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             **template_kwargs: Any) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate. ``tools`` and
        ``chat_template_kwargs`` (e.g. Qwen3's ``{"enable_thinking": False}``) reach the
        template, as in vLLM; other keyword arguments do too."""
        from vllm_volta.transformers_utils.tokenizer import apply_chat_template
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init is set)")
        is_batch = (isinstance(messages, Sequence) and len(messages) > 0
                    and not isinstance(messages[0], Mapping))
        conversations = list(messages) if is_batch else [messages]
        prompts = []
        for conversation in conversations:
            text = apply_chat_template(tokenizer, conversation, chat_template=chat_template,
                                       add_generation_prompt=add_generation_prompt,
                                       continue_final_message=continue_final_message, tools=tools,
                                       **{**(chat_template_kwargs or {}), **template_kwargs})
            ids = tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def _as_prompt_list(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    """One prompt -> [prompt]; a list of token ids is one prompt, not many."""
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]
    if isinstance(prompts, Sequence):
        return list(prompts)
    raise ValueError(f"prompts must be a string, token ids, a dict or a list of them, "
                     f"got {type(prompts).__name__}")


def _error_output(request_id: str, prompt: PromptInput, params: SamplingParams | PoolingParams | None,
                  error: str) -> RequestOutput:
    """A finished output for a prompt the engine rejected."""
    text = prompt if isinstance(prompt, str) else (
        prompt.get("prompt") if isinstance(prompt, Mapping) else None)
    token_ids = None
    if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
        token_ids = list(prompt["prompt_token_ids"])
    elif isinstance(prompt, list):
        token_ids = list(prompt)
    n = params.n if isinstance(params, SamplingParams) else 1
    outputs = [CompletionOutput(index=i, text="", token_ids=[], cumulative_logprob=None,
                                logprobs=None, finish_reason="error") for i in range(n)]
    return RequestOutput(request_id=request_id, prompt=text, prompt_token_ids=token_ids,
                         prompt_logprobs=None, outputs=outputs, finished=True, error=error)
