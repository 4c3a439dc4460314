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
from vllm_volta.entrypoints.openai.request_body import off_loop
from vllm_volta.entrypoints.openai.reasoning_parsers import REASONING_PARSERS, ReasoningStream, bind_prompt
from vllm_volta.entrypoints.openai.tool_parsers import (TOOL_PARSERS, NamedToolCall, RequiredToolCalls,
                                                        ToolParser, bind_tools)
from vllm_volta.transformers_utils.tokenizer import apply_chat_template


class OpenAIServingChat(OpenAIServing):
    """Handler of /v1/chat/completions (and chat-style /tokenize)."""

    def __init__(self, *args: Any, chat_template: str | None = None,
                 tool_call_parser: str | None = None, reasoning_parser: str | None = None,
                 **kwargs: Any) -> None:
        """``tool_call_parser``: the parser of --enable-auto-tool-choice --tool-call-parser NAME;
        without it, requests may pass tools to the template only with tool_choice "none".
        ``reasoning_parser``: --reasoning-parser NAME (reasoning_content apart from content)."""
        super().__init__(*args, **kwargs)
        self.chat_template = chat_template
        self.tool_parser = TOOL_PARSERS[tool_call_parser]() if tool_call_parser else None
        self.reasoning_parser = REASONING_PARSERS[reasoning_parser]() if reasoning_parser else None

    def render_chat(self, messages: list[ChatMessage], *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, chat_template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for a conversation (request template > --chat-template > model's)."""
        if continue_final_message:
            add_generation_prompt = False  # continuing a message means no new turn
        conversation = [m.template_dict() for m in messages]
        try:
            return apply_chat_template(
                self.tokenizer, conversation, chat_template=chat_template or self.chat_template,
                add_generation_prompt=add_generation_prompt, tools=tools,
                continue_final_message=continue_final_message, **(template_kwargs or {}))
        except Exception as exc:  # no template, jinja errors (roles must alternate): input
            raise OpenAIError(f"Chat template failed: {exc}", 400, "messages") from exc

    async def create_chat_completion(self, request: ChatCompletionRequest,
                                     raw_request: Request | None = None) -> Any:
        self.check_model(request.model)
        top = (request.top_logprobs or 0) if request.logprobs else None
        self.check_logprobs(top, "top_logprobs")
        self.check_logprobs(request.prompt_logprobs, "prompt_logprobs")
        tools = [t.model_dump() for t in request.tools] if request.tools else None
        parser, forced = self._tool_calls(request, tools)

        def prompt_ids_of() -> list[int]:  # templating and tokenizing: off the event loop
            prompt = self.render_chat(
                request.messages, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template=request.chat_template, template_kwargs=request.chat_template_kwargs,
                tools=tools)
            return self.tokenize(prompt, request.add_special_tokens, "messages")

        prompt_ids = await off_loop(prompt_ids_of)
        param = "max_completion_tokens" if request.max_completion_tokens is not None \
            else "max_tokens"
        max_tokens = self.resolve_max_tokens(len(prompt_ids), request.max_new_tokens, param)
        kwargs = request.sampling_kwargs()
        if top is not None:
            kwargs["logprobs"] = top
        if forced is not None:
            kwargs["structured_outputs"] = forced
        if any(getattr(p, "keeps_special_tokens", False) for p in (parser, self.reasoning_parser)):
            kwargs["skip_special_tokens"] = False
        params = self.make_sampling_params(
            {"logprobs": "top_logprobs", "max_tokens": param}, max_tokens=max_tokens, **kwargs)
        request_id = request.request_id or random_id("chatcmpl")
        streams = await self.add_requests(request_id, [prompt_ids], params)
        if request.stream:
            return StreamingResponse(self._stream(request, request_id, streams, prompt_ids, parser),
                                     media_type="text/event-stream")
        (final,) = await collect_final(streams, raw_request)
        return JSONResponse(self._response(request, request_id, final, prompt_ids, parser))

    def _tool_calls(self, request: ChatCompletionRequest, tools: list[dict] | None
                    ) -> tuple[ToolParser | None, dict | None]:
        """How the output's tool calls are read, and the structured output a forced call needs:
        tool_choice "auto" (with tools: the default) parses with the server's parser, only when
        it has one (as vLLM); "required" and a named function constrain the output to calls;
        "none" reads none. What cannot be served is a 400 naming tool_choice."""
        choice = request.tool_choice
        if choice is None:
            choice = "auto" if tools else "none"
        if choice != "none" and not tools:
            raise OpenAIError(f"tool_choice {choice!r} needs tools", 400, "tool_choice")
        if choice == "none":
            return None, None
        if choice == "auto":
            if self.tool_parser is None:
                raise OpenAIError('"auto" tool choice requires --enable-auto-tool-choice and '
                                  '--tool-call-parser to be set (or send tool_choice "none")', 400,
                                  "tool_choice")
            return bind_tools(self.tool_parser, tools), None
        if request.structured() is not None:
            raise OpenAIError("a forced tool call cannot be combined with response_format or "
                              "other structured outputs", 400, "tool_choice")
        if choice == "required":
            return RequiredToolCalls(), {"json": RequiredToolCalls.schema(tools)}
        name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
        tool = next((t for t in tools if t["function"]["name"] == name), None)
        if tool is None:
            raise OpenAIError(f"tool_choice names {name!r}, which is not one of the tools", 400,
                              "tool_choice")
        return NamedToolCall(name), {"json": tool["function"].get("parameters") or {"type": "object"}}

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
                  prompt_ids: list[int], parser: ToolParser | None) -> dict[str, Any]:
        choices, num_generated = [], 0
        for out in final.outputs:
            num_generated += len(out.token_ids)
            logprobs = None
            if request.logprobs:
                logprobs = self._logprobs(out.token_ids, out.logprobs or [],
                                          request.top_logprobs or 0)
            reasoning, content = (bind_prompt(self.reasoning_parser, self.tokenizer, prompt_ids).split(out.text)
                                  if self.reasoning_parser
                                  else (None, out.text))
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if self.reasoning_parser is not None:
                message["reasoning_content"] = reasoning
            finish_reason = out.finish_reason
            if parser is not None and content:
                message["content"], calls = parser.extract(content)
                if calls:
                    message["tool_calls"] = [c.to_dict() for c in calls]
                    finish_reason = parser.finish_reason or finish_reason
            choice = {"index": out.index, "message": message, "logprobs": logprobs,
                      "finish_reason": finish_reason, "stop_reason": out.stop_reason}
            if request.return_token_ids:
                choice["token_ids"] = out.token_ids
            choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        response = {"id": request_id, "object": "chat.completion", "created": now_s(),
                    "model": self.model_name, "choices": choices,
                    "usage": usage_dict(len(prompt_ids), num_generated)}
        if request.return_token_ids:
            response["prompt_token_ids"] = prompt_ids
        if request.prompt_logprobs is not None:
            response["prompt_logprobs"] = self.prompt_logprobs_json(final.prompt_logprobs)
        return response

    async def _stream(self, request: ChatCompletionRequest, request_id: str, streams: list,
                      prompt_ids: list[int], parser: ToolParser | None) -> AsyncIterator[str]:
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
        tool_calls = [parser.streamer() for _ in range(request.n)] if parser else None
        reasoning = ([ReasoningStream(bind_prompt(self.reasoning_parser, self.tokenizer, prompt_ids))
                      for _ in range(request.n)]
                     if self.reasoning_parser else None)
        try:
            async for _, out in merge_streams(streams):
                for comp in out.outputs:
                    i = comp.index
                    if finished[i]:
                        continue
                    done = comp.finish_reason is not None
                    delta_ids = comp.token_ids[sent_tokens[i]:]
                    delta = {"content": comp.text[sent_chars[i]:]}
                    content_so_far = comp.text
                    if reasoning is not None:
                        thought, delta["content"] = reasoning[i].feed(comp.text, done)
                        content_so_far = reasoning[i].content
                        if thought:
                            delta["reasoning_content"] = thought
                    if tool_calls is not None:
                        stream = tool_calls[i]
                        first = stream.num_calls
                        delta["content"], calls = stream.feed(content_so_far, done)
                        if calls:
                            delta["tool_calls"] = [{"index": first + k, **c.to_dict()}
                                                   for k, c in enumerate(calls)]
                    if delta_ids or delta["content"] or len(delta) > 1:
                        logprobs = None
                        if request.logprobs:
                            logprobs = self._logprobs(
                                delta_ids, (comp.logprobs or [])[sent_tokens[i]:],
                                request.top_logprobs or 0)
                        yield chunk(i, delta, logprobs, token_ids=delta_ids)
                    sent_tokens[i], sent_chars[i] = len(comp.token_ids), len(comp.text)
                    if done:
                        finished[i] = True
                        reason = comp.finish_reason
                        if tool_calls is not None and tool_calls[i].num_calls:
                            reason = parser.finish_reason or reason
                        yield chunk(i, {}, None, reason, comp.stop_reason)
            if request.include_usage_in_stream:
                yield encode(choices=[], usage=usage_dict(len(prompt_ids), sum(sent_tokens)))
        except (OpenAIError, RuntimeError, ValueError) as exc:
            yield stream_error(exc)
        yield sse("[DONE]")

