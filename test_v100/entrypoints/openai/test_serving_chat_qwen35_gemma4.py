"""Qwen3.5 (qwen3_coder calls, qwen3 reasoning with <think> opened by the prompt) and Gemma 4
(gemma4 calls and reasoning) chat outputs end to end: a real server whose tiny model is forced
to write a Qwen3.5 output, read with the openai client, streamed and not; and the chat handler
replaying a Gemma 4 output, read back with the client's types."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.chat import ChatCompletion

from test_v100.entrypoints.openai.conftest import MODEL_NAME, SERVER_ARGS
from test_v100.entrypoints.openai.test_serving_chat_tools import _handler, _scripted, _streamed
from test_v100.entrypoints.openai.utils import RemoteServer
from vllm_volta.entrypoints.openai.protocol import ChatCompletionRequest

# Qwen3.5's shape: the tools in the system turn, and with thinking on the prompt opens <think>.
QWEN35_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}}}}}]
# The template's layout for the first call, a compact one (no newlines) for the second.
QWEN35_OUTPUT = ("Two.\n</think>\n\nOK.\n<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
                 "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
                 "<tool_call><function=weather><parameter=metric>false</parameter></function></tool_call>")
WANT_CALLS = [("weather", {"city": "Paris", "days": 3}), ("weather", {"metric": False})]


@pytest.fixture(scope="module")
def xml_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer random Llama whose byte-level BPE knows the characters of XML tags (the shared
    tiny model's alphabet has no '<')."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("xml_llama")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  show_progress=False)
    tok.train_from_iterator([QWEN35_TEMPLATE + QWEN35_OUTPUT + "Hi? Tools: weather"] * 20, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    hf_tok.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
                         pad_token_id=hf_tok.pad_token_id, torch_dtype="float32")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return str(path)


def test_qwen35_output_through_a_real_server(xml_model, tmp_path):
    template = tmp_path / "qwen35.jinja"
    template.write_text(QWEN35_TEMPLATE)
    args = ["--model", xml_model, *SERVER_ARGS, "--max-model-len", "512", "--chat-template", str(template),
            "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3",
            "--no-engine-process"]
    with RemoteServer(args) as srv:
        client = srv.client()
        kwargs = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi?"}],
                      tools=TOOLS, max_tokens=200, extra_body={"guided_choice": [QWEN35_OUTPUT]})
        choice = client.chat.completions.create(**kwargs).choices[0]
        message = choice.message
        assert choice.finish_reason == "tool_calls"
        assert message.model_extra["reasoning_content"] == "Two.\n"
        assert message.content == "\n\nOK.\n"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == WANT_CALLS

        reasoning, content, calls, reasons = "", "", {}, []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for part in chunk.choices:
                reasoning += (part.delta.model_extra or {}).get("reasoning_content") or ""
                content += part.delta.content or ""
                for call in part.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
                reasons += [part.finish_reason] if part.finish_reason else []
    assert (reasoning, content, reasons) == ("Two.\n", "\n\nOK.\n", ["tool_calls"])
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls]
    assert all(c["id"] for c in calls.values())


Q = '<|"|>'
GEMMA4_OUTPUT = (f"<|channel>thought\nTwo cities.<channel|><|tool_call>call:weather{{city:{Q}Paris{Q},days:3}}"
                 f"<tool_call|><|tool_call>call:weather{{metric:false}}<tool_call|>")


@pytest.mark.parametrize("stream_step", [None, 1, 7])
def test_gemma4_output_through_the_chat_handler(stream_step):
    handler, seen = _handler("gemma4", "gemma4"), {}
    text = GEMMA4_OUTPUT
    cuts = [len(text)] if stream_step is None else list(range(stream_step, len(text), stream_step)) + [len(text)]
    _scripted(handler, text, cuts, seen)
    request = ChatCompletionRequest(model=MODEL_NAME, tools=TOOLS, messages=[{"role": "user", "content": "Weather?"}],
                                    stream=stream_step is not None)
    if stream_step is None:
        resp = asyncio.run(handler.create_chat_completion(request))
        choice = ChatCompletion.model_validate(json.loads(resp.body)).choices[0]
        got = (choice.message.model_extra["reasoning_content"], choice.message.content or "",
               [(c.function.name, c.function.arguments) for c in choice.message.tool_calls], [choice.finish_reason])
    else:
        content, reasoning, calls, reasons = _streamed(handler, request)
        got = (reasoning, content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], reasons)
    assert seen["params"].skip_special_tokens is False  # the markers are special tokens
    assert got == ("Two cities.", "", [(name, json.dumps(args)) for name, args in WANT_CALLS], ["tool_calls"])
