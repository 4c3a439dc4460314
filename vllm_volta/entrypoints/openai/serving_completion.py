"""POST /v1/completions: OpenAI's legacy completions API (vLLM's extensions included)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from vllm_volta.entrypoints.openai.errors import OpenAIError
from vllm_volta.entrypoints.openai.protocol import CompletionRequest
from vllm_volta.entrypoints.openai.request_body import off_loop
from vllm_volta.entrypoints.openai.serving_engine import (
    ChunkEncoder, OpenAIServing, clamp_logprob, collect_final, merge_streams, now_s, random_id,
    sse, stream_error, usage_dict)


class OpenAIServingCompletion(OpenAIServing):
    """Handler of /v1/completions."""

    async def create_completion(self, request: CompletionRequest,
                                raw_request: Request | None = None) -> Any:
        self.check_model(request.model)
        self.check_logprobs(request.logprobs, "logprobs")
        self.check_logprobs(request.prompt_logprobs, "prompt_logprobs")
        if request.suffix is not None:
            raise OpenAIError("suffix is not supported", 400, "suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise OpenAIError("best_of must equal n (other values are not supported)", 400,
                              "best_of")
        prompts = request.prompts()
        prompt_ids = await off_loop(
            lambda: [self.tokenize(p, request.add_special_tokens) for p in prompts])
        longest = max(len(ids) for ids in prompt_ids)
        max_tokens = self.resolve_max_tokens(longest, request.max_tokens)
        kwargs = request.sampling_kwargs()
        if request.logprobs is not None:
            kwargs["logprobs"] = request.logprobs
            if request.echo:  # echoed prompt tokens carry logprobs too
                kwargs["prompt_logprobs"] = max(request.logprobs, request.prompt_logprobs or 0)
        params = self.make_sampling_params(max_tokens=max_tokens, **kwargs)
        request_id = request.request_id or random_id("cmpl")
        # Without a tokenizer (--skip-tokenizer-init) only token-id prompts arrive; echo gives "".
        prompt_texts = await off_loop(lambda: [
            p if isinstance(p, str) else
            (self.tokenizer.decode(ids) if self.tokenizer is not None else "")
            for p, ids in zip(prompts, prompt_ids)])
        streams = await self.add_requests(request_id, prompt_ids, params)
        if request.stream:
            return StreamingResponse(
                self._stream(request, request_id, streams, prompt_ids, prompt_texts),
                media_type="text/event-stream")
        finals = await collect_final(streams, raw_request)
        return JSONResponse(self._response(request, request_id, finals, prompt_ids,
                                           prompt_texts))

    # --------------------------------------------------------------- logprobs
    def _logprobs(self, token_ids: list[int], steps: list[Any], num_top: int,
                  offset: int) -> dict[str, list]:
        """Completions-style logprobs; a ``None`` step (first prompt token) has none."""
        tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
        for tid, step in zip(token_ids, steps):
            chosen = step.get(tid) if step else None
            token = self.decode_token(tid, chosen)
            tokens.append(token)
            text_offset.append(offset)
            offset += len(token)
            if step is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(clamp_logprob(chosen.logprob) if chosen else None)
            ranked = sorted(step.items(), key=lambda kv: kv[1].logprob, reverse=True)
            top = dict(ranked[:num_top])
            if chosen is not None:
                top[tid] = chosen  # the sampled token is always listed, as in vLLM
            top_logprobs.append({self.decode_token(t, lp): clamp_logprob(lp.logprob)
                                 for t, lp in top.items()})
        return {"tokens": tokens, "token_logprobs": token_logprobs,
                "top_logprobs": top_logprobs, "text_offset": text_offset}

    def _prompt_logprobs(self, request: CompletionRequest, final: Any,
                         prompt_ids: list[int]) -> dict[str, list]:
        steps = list(getattr(final, "prompt_logprobs", None) or [None] * len(prompt_ids))
        return self._logprobs(prompt_ids, steps, request.logprobs or 0, 0)

    @staticmethod
    def _merge_logprobs(a: dict[str, list] | None, b: dict[str, list]) -> dict[str, list]:
        if a is None:
            return b
        return {k: a[k] + b[k] for k in b}

    # -------------------------------------------------------------- responses
    def _response(self, request: CompletionRequest, request_id: str, finals: list[Any],
                  prompt_ids: list[list[int]], prompt_texts: list[str]) -> dict[str, Any]:
        choices = []
        num_prompt = num_generated = 0
        for i, final in enumerate(finals):
            num_prompt += len(prompt_ids[i])
            for out in final.outputs:
                num_generated += len(out.token_ids)
                text, logprobs, offset = out.text, None, 0
                if request.echo:
                    text = prompt_texts[i] + text
                    offset = len(prompt_texts[i])
                    if request.logprobs is not None:
                        logprobs = self._prompt_logprobs(request, final, prompt_ids[i])
                if request.logprobs is not None:
                    gen = self._logprobs(out.token_ids, out.logprobs or [], request.logprobs,
                                         offset)
                    logprobs = self._merge_logprobs(logprobs, gen)
                choice = {"index": i * request.n + out.index, "text": text,
                          "logprobs": logprobs, "finish_reason": out.finish_reason,
                          "stop_reason": out.stop_reason}
                if request.return_token_ids:
                    choice["token_ids"] = out.token_ids
                    choice["prompt_token_ids"] = prompt_ids[i]
                if request.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = self.prompt_logprobs_json(final.prompt_logprobs)
                choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        return {"id": request_id, "object": "text_completion", "created": now_s(),
                "model": self.model_name, "choices": choices,
                "usage": usage_dict(num_prompt, num_generated)}

    async def _stream(self, request: CompletionRequest, request_id: str, streams: list,
                      prompt_ids: list[list[int]], prompt_texts: list[str]) -> AsyncIterator[str]:
        encode = ChunkEncoder({"id": request_id, "object": "text_completion", "created": now_s(),
                               "model": self.model_name})
        sent_tokens: dict[int, int] = {}
        sent_chars: dict[int, int] = {}
        finished: set[int] = set()
        num_generated = 0
        try:
            async for i, out in merge_streams(streams):
                for comp in out.outputs:
                    idx = i * request.n + comp.index
                    first = idx not in sent_tokens
                    n_tok, n_chr = sent_tokens.get(idx, 0), sent_chars.get(idx, 0)
                    delta_ids = comp.token_ids[n_tok:]
                    if idx in finished or (not delta_ids and comp.finish_reason is None
                                           and not first):
                        continue
                    if comp.finish_reason is not None:
                        finished.add(idx)
                    text, logprobs = comp.text[n_chr:], None
                    base = len(prompt_texts[i]) if request.echo else 0
                    if first and request.echo:
                        text = prompt_texts[i] + text
                        if request.logprobs is not None:
                            logprobs = self._prompt_logprobs(request, out, prompt_ids[i])
                    if request.logprobs is not None:
                        gen = self._logprobs(delta_ids, (comp.logprobs or [])[n_tok:],
                                             request.logprobs, base + n_chr)
                        logprobs = self._merge_logprobs(logprobs, gen)
                    num_generated += len(delta_ids)
                    sent_tokens[idx], sent_chars[idx] = len(comp.token_ids), len(comp.text)
                    choice = {"index": idx, "text": text, "logprobs": logprobs,
                              "finish_reason": comp.finish_reason,
                              "stop_reason": comp.stop_reason}
                    if request.return_token_ids:
                        choice["token_ids"] = delta_ids
                        if first:
                            choice["prompt_token_ids"] = prompt_ids[i]
                    yield encode(choices=[choice])
            if request.include_usage_in_stream:
                num_prompt = sum(len(ids) for ids in prompt_ids)
                yield encode(choices=[], usage=usage_dict(num_prompt, num_generated))
        except (OpenAIError, RuntimeError, ValueError) as exc:
            yield stream_error(exc)
        yield sse("[DONE]")
