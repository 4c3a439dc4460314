"""`vllm-volta chat` / `vllm-volta complete` against a real server on 127.0.0.1 (the tiny
random Llama, greedy by its generation_config.json): every answer must equal the one the
openai client gets for the same messages / prompt."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from test_v100.entrypoints.openai.utils import RemoteServer, build_tiny_llama, free_port
from vllm_volta.entrypoints.cli import parse_args
from vllm_volta.entrypoints.cli_client import run_chat, run_complete

API_KEY = "cli-secret"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny_llama_cli"))
    # Greedy and short by the model's own defaults, which chat/complete (no sampling flags) get.
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": MAX_TOKENS}))
    with RemoteServer(["--model", str(path), "--served-model-name", "tiny-llama", "--max-model-len", "128",
                       "--cpu-kvcache-space", "0.01", "--dtype", "float32", "--api-key", API_KEY]) as srv:
        yield srv


def _limit(max_tokens: int | None) -> dict:
    # As the command line: without --max-tokens the request leaves the field to the server.
    return {} if max_tokens is None else {"max_tokens": max_tokens}


def ref_chat(server, messages, max_tokens=None):
    resp = server.client(api_key=API_KEY).chat.completions.create(
        model="tiny-llama", messages=messages, temperature=0, **_limit(max_tokens))
    return resp.choices[0].message.content


def ref_complete(server, prompt, max_tokens=None):
    resp = server.client(api_key=API_KEY).completions.create(
        model="tiny-llama", prompt=prompt, temperature=0, **_limit(max_tokens))
    return resp.choices[0].text


def test_client_flags_parse_as_vllms():
    args = parse_args(["chat", "--url", "http://h:1/v1", "--model-name", "m", "--api-key", "k",
                       "--system-prompt", "be brief", "-q", "hi", "--max-tokens", "5"])
    assert (args.url, args.model_name, args.api_key, args.system_prompt, args.quick, args.max_tokens) == (
        "http://h:1/v1", "m", "k", "be brief", "hi", 5)
    args = parse_args(["complete", "--quick", "x"])
    assert (args.url, args.model_name, args.quick) == ("http://localhost:8000/v1", None, "x")
    with pytest.raises(SystemExit):
        parse_args(["complete", "--system-prompt", "s"])  # chat only, as in vLLM


@pytest.mark.parametrize("argv,match", [
    (["chat", "--max-tokens", "0"], "--max-tokens must be a positive integer, got 0"),
    (["complete", "--url", "localhost:8000"], "--url must be an http:// or https:// URL"),
])
def test_bad_values_name_the_flag(argv, match):
    with pytest.raises(ValueError, match=match):
        (run_chat if argv[0] == "chat" else run_complete)(parse_args(argv))


def test_chat_quick_with_system_prompt_and_default_model(server):
    out = io.StringIO()
    run_chat(parse_args(["chat", "--url", server.url + "/v1", "--api-key", API_KEY,
                         "--system-prompt", "You are terse.", "--quick", "Hello world"]), out=out)
    expected = ref_chat(server, [{"role": "system", "content": "You are terse."},
                                 {"role": "user", "content": "Hello world"}])
    assert out.getvalue() == expected + "\n"


def test_chat_interactive_keeps_the_conversation(server):
    """The console script itself, messages on stdin: each answer sees the earlier turns."""
    env = {**os.environ, "OPENAI_API_KEY": API_KEY}  # the key from the environment, as vLLM's
    proc = subprocess.run([sys.executable, "-c", "from vllm_volta.entrypoints.cli import main; main()",
                           "chat", "--url", server.url + "/v1", "--model-name", "tiny-llama"],
                          input="Hello server\nThe quick brown fox\n", capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    messages = [{"role": "user", "content": "Hello server"}]
    first = ref_chat(server, messages)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "The quick brown fox"}]
    assert proc.stdout == f"{first}\n{ref_chat(server, messages)}\n"
    assert "Using model: tiny-llama" in proc.stderr


def test_complete_quick_and_lines(server):
    out = io.StringIO()
    run_complete(parse_args(["complete", "--url", server.url + "/v1", "--api-key", API_KEY,
                             "--max-tokens", "3", "-q", "The capital of France"]), out=out)
    assert out.getvalue() == ref_complete(server, "The capital of France", 3) + "\n"
    out = io.StringIO()
    run_complete(parse_args(["complete", "--url", server.url + "/v1", "--api-key", API_KEY]),
                 inp=io.StringIO("Volta GPUs\nA paged KV cache\n"), out=out)
    assert out.getvalue() == f"{ref_complete(server, 'Volta GPUs')}\n{ref_complete(server, 'A paged KV cache')}\n"


def test_wrong_key_unreachable_server_and_refused_request_are_one_line(server):
    with pytest.raises(SystemExit, match="refused the API key \\(--api-key or \\$OPENAI_API_KEY\\)"):
        run_chat(parse_args(["chat", "--url", server.url + "/v1", "--api-key", "wrong",
                             "--model-name", "tiny-llama", "-q", "hi"]), out=io.StringIO())
    with pytest.raises(SystemExit, match="answered 404: .*no-such-model"):
        run_complete(parse_args(["complete", "--url", server.url + "/v1", "--api-key", API_KEY,
                                 "--model-name", "no-such-model", "-q", "hi"]), out=io.StringIO())
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(SystemExit, match=f"cannot reach the server at --url {dead}"):
        run_complete(parse_args(["complete", "--url", dead, "--model-name", "m", "-q", "hi"]), out=io.StringIO())
