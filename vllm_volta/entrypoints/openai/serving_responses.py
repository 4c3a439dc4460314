"""POST /v1/responses: OpenAI's Responses API, text in and text out, through the chat handler
(its template, sampling defaults and engine requests). The output is one assistant message of
``output_text``; a stream is the API's events (response.created, output item and content part
added, output_text deltas, the done events, response.completed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from vllm_volta.entrypoints.openai.errors import OpenAIError
from vllm_volta.entrypoints.openai.protocol import ResponsesRequest
from vllm_volta.entrypoints.openai.request_body import off_loop
from vllm_volta.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm_volta.entrypoints.openai.serving_engine import (collect_final, merge_streams, now_s, random_id,
                                                          stream_error)


class OpenAIServingResponses:
    """Handler of /v1/responses over a chat handler."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def create_response(self, request: ResponsesRequest, raw_request: Request | None = None) -> Any:
        chat = self.chat
        chat.check_model(request.model)
        for field in ("tools", "previous_response_id"):
            if getattr(request, field):
                raise OpenAIError(f"{field} is not supported on /v1/responses (use /v1/chat/completions "
                                  "for tools; responses are not stored)", 400, field)
        prompt_ids = await off_loop(
            lambda: chat.tokenize(chat.render_chat(request.chat_messages()), False, "input"))
        max_tokens = chat.resolve_max_tokens(len(prompt_ids), request.max_output_tokens, "max_output_tokens")
        params = chat.make_sampling_params({"max_tokens": "max_output_tokens"}, max_tokens=max_tokens,
                                           **request.sampling_kwargs())
        ids = {"response": random_id("resp"), "message": random_id("msg"), "created": now_s()}
        streams = await chat.add_requests(ids["response"], [prompt_ids], params)
        if request.stream:
            return StreamingResponse(self._stream(request, ids, streams, len(prompt_ids)),
                                     media_type="text/event-stream")
        (final,) = await collect_final(streams, raw_request)
        out = final.outputs[0]
        return JSONResponse(self._response(request, ids, out.text, out.finish_reason, len(prompt_ids),
                                           len(out.token_ids)))

    def _message(self, ids: dict[str, Any], text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []
        return {"type": "message", "id": ids["message"], "role": "assistant", "status": status, "content": content}

    def _response(self, request: ResponsesRequest, ids: dict[str, Any], text: str | None, finish_reason: str | None,
                  num_prompt: int, num_output: int) -> dict[str, Any]:
        """The response object; ``text`` None: still running (no output yet)."""
        status = "in_progress" if text is None else ("incomplete" if finish_reason == "length" else "completed")
        body: dict[str, Any] = {
            "id": ids["response"], "object": "response", "created_at": ids["created"],
            "model": self.chat.model_name, "status": status,
            "output": [] if text is None else [self._message(ids, text, "completed")],
            "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature, "top_p": request.top_p, "metadata": request.metadata or {},
            "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "text": {"format": {"type": "text"}}, "usage": None}
        if text is not None:
            body["usage"] = {"input_tokens": num_prompt, "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": num_output, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": num_prompt + num_output}
        return body

    async def _stream(self, request: ResponsesRequest, ids: dict[str, Any], streams: list[Any],
                      num_prompt: int) -> AsyncIterator[str]:
        sequence = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal sequence
            sequence += 1
            return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': sequence - 1, **fields})}\n\n"

        where = {"item_id": ids["message"], "output_index": 0}
        yield event("response.created", response=self._response(request, ids, None, None, num_prompt, 0))
        yield event("response.output_item.added", output_index=0, item=self._message(ids, "", "in_progress"))
        yield event("response.content_part.added", **where, content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []})
        text, final = "", None
        try:
            async for _, out in merge_streams(streams):
                new = out.outputs[0].text[len(text):]
                if new:
                    text += new
                    yield event("response.output_text.delta", **where, content_index=0, delta=new, logprobs=[])
                final = out
        except (OpenAIError, RuntimeError, ValueError) as exc:  # the request failed: an error event ends it
            yield stream_error(exc)
            return
        out = final.outputs[0]
        yield event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
        yield event("response.content_part.done", **where, content_index=0,
                    part={"type": "output_text", "text": text, "annotations": []})
        yield event("response.output_item.done", output_index=0, item=self._message(ids, text, "completed"))
        yield event("response.completed",
                    response=self._response(request, ids, text, out.finish_reason, num_prompt, len(out.token_ids)))
