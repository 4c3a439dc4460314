"""Tool calling (--enable-auto-tool-choice --tool-call-parser) and reasoning
(--reasoning-parser) on /v1/chat/completions: the handler over an engine that replays a scripted
output, its responses and streams read back with the openai client's own types; the flags on a
real server."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from test_v100.entrypoints.openai.conftest import MODEL_NAME, SERVER_ARGS
from test_v100.entrypoints.openai.utils import RemoteServer
from test_v100.worker.tiny_models import build_tokenizer
from vllm_volta.entrypoints.openai.errors import OpenAIError
from vllm_volta.entrypoints.openai.protocol import ChatCompletionRequest
from vllm_volta.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm_volta.outputs import CompletionOutput, RequestOutput

# A Qwen-style template: tools in the system turn, earlier calls and tool results rendered.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} "
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": {"type": "object"}}}]
OUTPUT = ('I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
MESSAGES = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
    {"role": "user", "content": "And Paris and Rome?"}]


class _Stream:
    """What add_requests returns: the scripted cumulative outputs, in steps."""

    def __init__(self, steps: list[RequestOutput]) -> None:
        self.steps = steps

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for out in self.steps:
            yield out

    def close(self) -> None:
        pass


def _handler(parser: str | None = "hermes", reasoning: str | None = None) -> OpenAIServingChat:
    engine = SimpleNamespace(get_tokenizer=build_tokenizer)
    return OpenAIServingChat(engine, [MODEL_NAME], max_model_len=4096, vocab_size=384,
                             chat_template=TEMPLATE, tool_call_parser=parser, reasoning_parser=reasoning)


def _scripted(handler, text: str, cuts: list[int], seen: dict) -> None:
    async def add_requests(request_id, prompts, params):
        seen["prompt"] = handler.tokenizer.decode(prompts[0])
        seen["params"] = params
        steps = [RequestOutput(request_id, None, prompts[0], None, [CompletionOutput(
            0, text[:cut], list(range(cut // 8)), None, None, "stop" if cut == len(text) else None)],
            cut == len(text)) for cut in cuts]
        return [_Stream(steps)]

    handler.add_requests = add_requests


def _request(**kwargs) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, **kwargs)


def test_response_carries_the_calls():
    handler, seen = _handler(), {}
    _scripted(handler, OUTPUT, [len(OUTPUT)], seen)
    resp = asyncio.run(handler.create_chat_completion(_request()))
    parsed = ChatCompletion.model_validate(json.loads(resp.body))
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will look.\n"
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert calls[0].id != calls[1].id
    # The template saw the tools, the earlier call (its arguments as a dict) and its result.
    assert "Tools: get_weather" in seen["prompt"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in seen["prompt"]
    assert "<|im_start|>tool\n-3 C" in seen["prompt"]


LLAMA_OUTPUT = ('{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                '{"name": "get_weather", "parameters": {"city": "Rome"}}')
MISTRAL_OUTPUT = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'


def test_mistral_keeps_special_tokens_in_the_text():
    """[TOOL_CALLS] is a special token: with the mistral parser the engine is asked to keep
    special tokens, so the parser sees the marker; the other parsers leave the default."""
    for parser, keep in (("mistral", True), ("hermes", False)):
        handler, seen = _handler(parser), {}
        _scripted(handler, MISTRAL_OUTPUT, [len(MISTRAL_OUTPUT)], seen)
        message = json.loads(asyncio.run(handler.create_chat_completion(_request())).body)["choices"][0]["message"]
        assert seen["params"].skip_special_tokens is (not keep)
        assert bool(message.get("tool_calls")) is keep


@pytest.mark.parametrize("parser,output,content", [("hermes", OUTPUT, "I will look.\n"),
                                                   ("llama3_json", LLAMA_OUTPUT, ""),
                                                   ("mistral", MISTRAL_OUTPUT, "")])
@pytest.mark.parametrize("step", [23, 3])
def test_stream_adds_up_to_the_response(parser, output, content, step):
    handler = _handler(parser)
    _scripted(handler, output, list(range(step, len(output), step)) + [len(output)], {})

    streamed, _, calls, reasons = _streamed(handler, _request(stream=True))
    assert streamed == content and reasons == ["tool_calls"]
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]


def _streamed(handler, request):
    """(content, reasoning_content, {index: call}, finish reasons) as a client adds them up."""
    async def collect():
        resp = await handler.create_chat_completion(request)
        return [part async for part in resp.body_iterator]

    events = [line[len("data: "):] for part in asyncio.run(collect())
              for line in part.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    content, reasoning, calls, reasons = "", "", {}, []
    for event in events[:-1]:
        chunk = ChatCompletionChunk.model_validate(json.loads(event))
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for call in choice.delta.tool_calls or []:  # as clients accumulate them
                entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return content, reasoning, calls, reasons


THINKING = "<think>\nThe user wants two cities.\n</think>\n\n" + OUTPUT


@pytest.mark.parametrize("step", [0, 17, 2])
def test_reasoning_apart_from_content_and_calls(step):
    """qwen3 reasoning with hermes calls: the <think> block goes to reasoning_content, the calls
    are parsed from what follows; streamed (step > 0) or whole."""
    handler = _handler("hermes", "qwen3")
    cuts = list(range(step, len(THINKING), step)) if step else []
    _scripted(handler, THINKING, cuts + [len(THINKING)], {})
    if not step:
        message = json.loads(asyncio.run(handler.create_chat_completion(_request())).body)["choices"][0]["message"]
        assert message["reasoning_content"] == "\nThe user wants two cities.\n"
        assert message["content"] == "\n\nI will look.\n"
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_weather"]
        return
    content, reasoning, calls, reasons = _streamed(handler, _request(stream=True))
    assert reasoning == "\nThe user wants two cities.\n" and content == "\n\nI will look.\n"
    assert [json.loads(c["arguments"]) for _, c in sorted(calls.items())] == [{"city": "Paris"}, {"city": "Rome"}]
    assert reasons == ["tool_calls"]


def test_reasoning_without_tools():
    handler = _handler(None, "deepseek_r1")
    text = "Two plus two.</think>4"
    _scripted(handler, text, [5, 16, len(text)], {})
    plain = ChatCompletionRequest(model=MODEL_NAME, messages=MESSAGES[:1])
    assert _streamed(handler, plain.model_copy(update={"stream": True}))[:2] == ("4", "Two plus two.")
    message = json.loads(asyncio.run(handler.create_chat_completion(plain)).body)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Two plus two.", "4")


def test_tool_choice_none_and_no_call_keep_plain_content():
    handler = _handler()
    _scripted(handler, OUTPUT, [len(OUTPUT)], {})
    resp = asyncio.run(handler.create_chat_completion(_request(tool_choice="none")))
    message = json.loads(resp.body)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": OUTPUT}
    _scripted(handler, "Sunny.", [6], {})
    body = json.loads(asyncio.run(handler.create_chat_completion(_request())).body)
    assert body["choices"][0]["message"]["content"] == "Sunny."
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_constrain_the_output(stream):
    """tool_choice naming a function: the output is constrained to its parameters and read as
    that call (finish_reason "stop", as OpenAI); "required": to an array of calls. No server
    flag is needed."""
    from vllm_volta.entrypoints.openai.tool_parsers import RequiredToolCalls

    cases = [({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Paris"}',
              {"type": "object"}, [("get_weather", {"city": "Paris"})], "stop"),
             ("required", '[{"name": "get_weather", "parameters": {"city": "Rome"}}]',
              RequiredToolCalls.schema(TOOLS), [("get_weather", {"city": "Rome"})], "tool_calls")]
    for choice, output, schema, want, reason in cases:
        handler, seen = _handler(None), {}
        _scripted(handler, output, [5, len(output)], seen)
        request = _request(tool_choice=choice, stream=stream)
        if stream:
            content, _, calls, reasons = _streamed(handler, request)
            got = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
        else:
            body = json.loads(asyncio.run(handler.create_chat_completion(request)).body)
            choice_out = ChatCompletion.model_validate(body).choices[0]
            content, reasons = choice_out.message.content or "", [choice_out.finish_reason]
            got = [(c.function.name, json.loads(c.function.arguments)) for c in choice_out.message.tool_calls]
        assert got == want and content == "" and reasons == [reason]
        assert seen["params"].structured_outputs.json == schema


@pytest.mark.parametrize("parser,kwargs,message", [
    ("hermes", {"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not one of the tools"),
    ("hermes", {"tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined with response_format"),
    (None, {}, '"auto" tool choice requires --enable-auto-tool-choice'),
])
def test_what_cannot_be_served_is_a_400_naming_tool_choice(parser, kwargs, message):
    with pytest.raises(OpenAIError, match=message) as info:
        asyncio.run(_handler(parser).create_chat_completion(_request(**kwargs)))
    assert (info.value.status, info.value.param) == (400, "tool_choice")
    with pytest.raises(OpenAIError, match="needs tools"):
        asyncio.run(_handler().create_chat_completion(ChatCompletionRequest(
            model=MODEL_NAME, messages=MESSAGES, tool_choice="auto")))


def test_server_flags(tiny_model, tmp_path):
    """--enable-auto-tool-choice needs --tool-call-parser; with both, a request with tools is
    served (the random model writes no call: plain content)."""
    from vllm_volta.entrypoints.cli import parse_args
    from vllm_volta.entrypoints.openai.cli_args import tool_call_parser

    with pytest.raises(ValueError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        tool_call_parser(parse_args(["serve", "--enable-auto-tool-choice"]))
    with pytest.raises(SystemExit):
        parse_args(["serve", "--tool-call-parser", "nope"])
    assert parse_args(["serve", "--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    args = ["--model", tiny_model, *SERVER_ARGS, "--chat-template", str(template),
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
            "--no-engine-process"]
    with RemoteServer(args) as srv:
        resp = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL_NAME, "messages": MESSAGES[:1], "tools": TOOLS, "max_tokens": 4})
        assert resp.status_code == 200, resp.text
        message = ChatCompletion.model_validate(resp.json()).choices[0].message
        assert message.role == "assistant" and "reasoning_content" in message.model_extra
        # A named function with no parameters: the constrained output is "{}".
        empty = [{"type": "function", "function": {"name": "ping", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": False}}}]
        resp = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL_NAME, "messages": MESSAGES[:1], "tools": empty, "max_tokens": 8,
            "tool_choice": {"type": "function", "function": {"name": "ping"}}})
        call = ChatCompletion.model_validate(resp.json()).choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == ("ping", {})
