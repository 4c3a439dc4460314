"""POST /v1/chat/completions: chat template -> prompt -> engine -> OpenAI chat shapes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from vllm_volta.entrypoints.openai.errors import OpenAIError
from vllm_volta.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from vllm_volta.entrypoints.openai.serving_engine import (
    LOGPROB_FLOOR, ChunkEncoder, OpenAIServing, clamp_logprob, collect_final, merge_streams, now_s,
    random_id, sse, stream_error, usage_dict)
from vllm_volta.transformers_utils.tokenizer import apply_chat_template


class OpenAIServingChat(OpenAIServing):
    """Handler of /v1/chat/completions (and chat-style /tokenize)."""

    def __init__(self, *args: Any, chat_template: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chat_template = chat_template

    def render_chat(self, messages: list[ChatMessage], *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, chat_template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text for a conversation (request template > --chat-template > model's)."""
        if continue_final_message:
            add_generation_prompt = False  # continuing a message means no new turn
        conversation = [{"role": m.role, "content": m.text()} for m in messages]
        try:
            return apply_chat_template(
                self.tokenizer, conversation, chat_template=chat_template or self.chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(template_kwargs or {}))
        except Exception as exc:  # no template, jinja errors (roles must alternate): input
            raise OpenAIError(f"Chat template failed: {exc}", 400, "messages") from exc

    async def create_chat_completion(self, request: ChatCompletionRequest,
                                     raw_request: Request | None = None) -> Any:
        self.check_model(request.model)
        top = (request.top_logprobs or 0) if request.logprobs else None
        self.check_logprobs(top, "top_logprobs")
        prompt = self.render_chat(
            request.messages, add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template=request.chat_template, template_kwargs=request.chat_template_kwargs)
        prompt_ids = self.tokenize(prompt, request.add_special_tokens)
        param = "max_completion_tokens" if request.max_completion_tokens is not None \
            else "max_tokens"
        max_tokens = self.resolve_max_tokens(len(prompt_ids), request.max_new_tokens, param)
        extra = {"logprobs": top} if top is not None else {}
        params = self.make_sampling_params(
            {"logprobs": "top_logprobs", "max_tokens": param},
            max_tokens=max_tokens, **request.sampling_kwargs(), **extra)
        request_id = request.request_id or random_id("chatcmpl")
        streams = await self.add_requests(request_id, [prompt_ids], params)
        if request.stream:
            return StreamingResponse(self._stream(request, request_id, streams, prompt_ids),
                                     media_type="text/event-stream")
        (final,) = await collect_final(streams, raw_request)
        return JSONResponse(self._response(request, request_id, final, prompt_ids))

    def _logprobs(self, token_ids: list[int], steps: list[Any], num_top: int) -> dict:
        """Chat-style logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
        def entry(tid: int, lp: Any) -> dict[str, Any]:
            token = self.decode_token(tid, lp)
            return {"token": token, "logprob": clamp_logprob(lp.logprob),
                    "bytes": list(token.encode("utf-8"))}

        content = []
        for tid, step in zip(token_ids, steps):
            step = step or {}
            chosen = step.get(tid)
            item = entry(tid, chosen) if chosen is not None else \
                {"token": self.decode_token(tid), "logprob": LOGPROB_FLOOR, "bytes": None}
            ranked = sorted(step.items(), key=lambda kv: kv[1].logprob, reverse=True)
            item["top_logprobs"] = [entry(t, lp) for t, lp in ranked[:num_top]]
            content.append(item)
        return {"content": content}

    def _response(self, request: ChatCompletionRequest, request_id: str, final: Any,
                  prompt_ids: list[int]) -> dict[str, Any]:
        choices, num_generated = [], 0
        for out in final.outputs:
            num_generated += len(out.token_ids)
            logprobs = None
            if request.logprobs:
                logprobs = self._logprobs(out.token_ids, out.logprobs or [],
                                          request.top_logprobs or 0)
            choice = {"index": out.index,
                      "message": {"role": "assistant", "content": out.text},
                      "logprobs": logprobs, "finish_reason": out.finish_reason,
                      "stop_reason": out.stop_reason}
            if request.return_token_ids:
                choice["token_ids"] = out.token_ids
            choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        response = {"id": request_id, "object": "chat.completion", "created": now_s(),
                    "model": self.model_name, "choices": choices,
                    "usage": usage_dict(len(prompt_ids), num_generated)}
        if request.return_token_ids:
            response["prompt_token_ids"] = prompt_ids
        return response

    async def _stream(self, request: ChatCompletionRequest, request_id: str, streams: list,
                      prompt_ids: list[int]) -> AsyncIterator[str]:
        encode = ChunkEncoder({"id": request_id, "object": "chat.completion.chunk",
                               "created": now_s(), "model": self.model_name})

        def chunk(index: int, delta: dict, logprobs: Any = None,
                  finish_reason: str | None = None, stop_reason: Any = None,
                  token_ids: list[int] | None = None, **fields: Any) -> str:
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = stop_reason
            if request.return_token_ids:
                choice["token_ids"] = token_ids or []
            return encode(choices=[choice], **fields)

        # Role first, for every choice, before any token arrives; the prompt's ids (when asked
        # for) with the first.
        for index in range(request.n):
            first = {"prompt_token_ids": prompt_ids} if request.return_token_ids and not index else {}
            yield chunk(index, {"role": "assistant", "content": ""}, **first)
        sent_tokens = [0] * request.n
        sent_chars = [0] * request.n
        finished = [False] * request.n
        try:
            async for _, out in merge_streams(streams):
                for comp in out.outputs:
                    i = comp.index
                    if finished[i]:
                        continue
                    delta_ids = comp.token_ids[sent_tokens[i]:]
                    delta_text = comp.text[sent_chars[i]:]
                    if delta_ids or delta_text:
                        logprobs = None
                        if request.logprobs:
                            logprobs = self._logprobs(
                                delta_ids, (comp.logprobs or [])[sent_tokens[i]:],
                                request.top_logprobs or 0)
                        yield chunk(i, {"content": delta_text}, logprobs, token_ids=delta_ids)
                    sent_tokens[i], sent_chars[i] = len(comp.token_ids), len(comp.text)
                    if comp.finish_reason is not None:
                        finished[i] = True
                        yield chunk(i, {}, None, comp.finish_reason, comp.stop_reason)
            if request.include_usage_in_stream:
                yield encode(choices=[], usage=usage_dict(len(prompt_ids), sum(sent_tokens)))
        except (OpenAIError, RuntimeError, ValueError) as exc:
            yield stream_error(exc)
        yield sse("[DONE]")

