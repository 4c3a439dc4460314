"""Request schemas of the OpenAI-compatible API (OpenAI's fields plus vLLM's extras).

Range checks that OpenAI documents live here so that a bad value is a 400 naming
the field; everything else is validated by ``SamplingParams``. Unknown fields are
ignored, as vLLM and OpenAI do.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


def _not_empty(field: str, value: Any) -> Any:
    """A prompt / input field's check: a list must hold something."""
    if isinstance(value, list) and not value:
        raise ValueError(f"{field} must not be an empty list")
    return value


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # token id (JSON: a string key) -> bias added to its logit, in [-100, 100]
    logit_bias: dict[str, float] | None = None
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", ...}}
    response_format: dict[str, Any] | None = None
    # vLLM extras, passed by clients through extra_body.
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    request_id: str | None = None
    # vLLM's extra: each choice also carries its generated ids ("token_ids"; in a stream, the
    # ids of that chunk), and the prompt's ids come along ("prompt_token_ids": on each choice
    # for completions, on the response for chat; in a stream, once, on the first chunk).
    return_token_ids: bool = False
    allowed_token_ids: list[int] | None = None
    # The prompt tokens' logprobs (each with this many top alternatives), in the response.
    prompt_logprobs: int | None = Field(default=None, ge=0)
    # vLLM's structured outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...},
    # and its older guided_* fields.
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_in_range(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (v or {}).items():
            if not -100 <= bias <= 100:
                raise ValueError(f"the bias of token {token} is {bias}; it must be in [-100, 100]")
        return v

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = (v or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
        if kind == "json_schema":
            spec = v.get("json_schema")
            # No schema would constrain nothing: refused rather than answered unconstrained.
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise ValueError("json_schema must be {'name': ..., 'schema': {...}} with a schema")
        return v

    def structured(self) -> dict[str, Any] | None:
        """The structured_outputs of this request (response_format, structured_outputs or a
        guided_* field: at most one)."""
        given = {}
        kind = (self.response_format or {}).get("type", "text")
        if kind == "json_object":
            given["response_format"] = {"json_object": True}
        elif kind == "json_schema":
            given["response_format"] = {"json": self.response_format["json_schema"]["schema"]}
        if self.structured_outputs is not None:
            given["structured_outputs"] = self.structured_outputs
        for name in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{name}")
            if value is not None:
                given[f"guided_{name}"] = {name: value}
        if len(given) > 1:
            raise ValueError(f"set one way of structured outputs, got {sorted(given)}")
        return next(iter(given.values()), None)

    @model_validator(mode="after")
    def _one_structured_output(self) -> _SamplingFields:
        self.structured()
        return self

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self) -> _SamplingFields:
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs are not available when stream is true")
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be set when stream is true")
        return self

    def sampling_kwargs(self) -> dict[str, Any]:
        """The SamplingParams fields this request sets (unset ones keep their defaults)."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        kwargs: dict[str, Any] = {
            "n": self.n, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "min_p": self.min_p, "seed": self.seed, "stop": stop,
            "stop_token_ids": self.stop_token_ids, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "ignore_eos": self.ignore_eos or None, "min_tokens": self.min_tokens or None,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output or None,
            "logit_bias": self.logit_bias, "allowed_token_ids": self.allowed_token_ids,
            "structured_outputs": self.structured(), "prompt_logprobs": self.prompt_logprobs,
        }
        return {k: v for k, v in kwargs.items() if v is not None}

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True

    _prompt_not_empty = field_validator("prompt")(lambda cls, v: _not_empty("prompt", v))

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        return _prompt_list(self.prompt)


def _prompt_list(p: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """A prompt field (one text, texts, one prompt's token ids, several) as a list of prompts."""
    if isinstance(p, str):
        return [p]
    if all(isinstance(x, int) for x in p):
        return [list(p)]  # one prompt given as token ids
    return list(p)


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings (OpenAI's fields, and vLLM's add_special_tokens)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    add_special_tokens: bool = True

    _input_not_empty = field_validator("input")(lambda cls, v: _not_empty("input", v))

    def inputs(self) -> list[str | list[int]]:
        return _prompt_list(self.input)


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are supported."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text

    @field_validator("arguments")
    @classmethod
    def _json(cls, v: str) -> str:
        try:
            json.loads(v)
        except json.JSONDecodeError:
            raise ValueError(f"tool call arguments must be JSON text, got {v!r}") from None
        return v


class MessageToolCall(BaseModel):
    """A call in an earlier assistant message (as the server returned it)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    def text(self) -> str:
        """Content as plain text: text parts are joined with newlines."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it: text content, and tool calls with their
        arguments as a dict (HF templates render them with tojson), as vLLM passes them."""
        msg: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            msg["name"] = self.name
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                for c in self.tool_calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


class ChatTool(BaseModel):
    """{"type": "function", "function": {"name", "description", "parameters"}}."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _named(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(v.get("name"), str) or not v["name"]:
            raise ValueError("a tool's function needs a name")
        return v


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    # vLLM extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    # Function tools (rendered by the chat template) and how the model may use them; calls in
    # the output are parsed with --enable-auto-tool-choice --tool-call-parser (serving_chat.py).
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        # max_completion_tokens is OpenAI's newer name; it wins when both are set.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def conversation(self) -> list[dict[str, Any]]:
        return [m.template_dict() for m in self.messages]


class TokenizeRequest(BaseModel):
    """POST /tokenize: either a prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt or messages must be given")
        return self


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]


class ResponseInputPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["input_text", "output_text", "text"]
    text: str


class ResponseInputMessage(BaseModel):
    """An item of the Responses API's ``input`` list: a message with text content."""

    model_config = ConfigDict(extra="allow")
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ResponseInputPart]

    def chat_message(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)
        return ChatMessage(role=self.role, content=text)


class ResponsesRequest(BaseModel):
    """POST /v1/responses: OpenAI's Responses API for text in and text out (and vLLM's
    ignore_eos, seed). Not served, and refused with a 400 naming the field: tools and
    previous_response_id (responses are not stored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str | list[ResponseInputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    tools: list[dict[str, Any]] | None = None
    previous_response_id: str | None = None
    ignore_eos: bool = False
    seed: int | None = None

    _input_not_empty = field_validator("input")(lambda cls, v: _not_empty("input", v))

    def chat_messages(self) -> list[ChatMessage]:
        """The conversation: instructions as the system message, then the input."""
        messages = [] if self.instructions is None else [ChatMessage(role="system", content=self.instructions)]
        if isinstance(self.input, str):
            return [*messages, ChatMessage(role="user", content=self.input)]
        return [*messages, *(item.chat_message() for item in self.input)]

    def sampling_kwargs(self) -> dict[str, Any]:
        kwargs = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                  "ignore_eos": self.ignore_eos or None}
        return {k: v for k, v in kwargs.items() if v is not None}
