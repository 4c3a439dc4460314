"""`vllm-volta serve`: vLLM's flag names reach EngineArgs; MODEL is optional (default model)."""

from __future__ import annotations

import sys

import pytest

from test_v100.entrypoints.openai.utils import RemoteServer
from vllm_volta.entrypoints.cli import parse_args
from vllm_volta.entrypoints.openai.cli_args import build_engine_args, check_vllm_flags, load_chat_template


def test_vllm_flags_reach_engine_args():
    args = parse_args([
        "serve", "/models/m", "--host", "127.0.0.1", "--port", "8123", "--api-key", "k",
        "--served-model-name", "my-model", "--dtype", "half", "--max-model-len", "2048",
        "--gpu-memory-utilization", "0.8", "--max-num-seqs", "32",
        "--max-num-batched-tokens", "4096", "--no-enable-prefix-caching", "--seed", "7",
        "--enforce-eager", "--async-scheduling", "--tensor-parallel-size", "1", "--load-format", "dummy",
        "--tokenizer", "/models/tok", "--uvicorn-log-level", "warning",
        "--chat-template", "{{ messages }}"])
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 8123, "k")
    assert args.uvicorn_log_level == "warning" and args.chat_template == "{{ messages }}"
    ea = build_engine_args(args)
    expected = dict(model="/models/m", served_model_name="my-model", dtype="half",
                    max_model_len=2048, gpu_memory_utilization=0.8, max_num_seqs=32,
                    max_num_batched_tokens=4096, enable_prefix_caching=False, seed=7,
                    enforce_eager=True, async_scheduling=True, tensor_parallel_size=1,
                    load_format="dummy", tokenizer="/models/tok")
    assert {k: getattr(ea, k) for k in expected} == expected


def test_vllm_only_flags_are_accepted_and_logged(capsys):
    """A command written for vLLM (the V100 fork's recommended one among them) runs unchanged:
    flags whose subject does not exist here are accepted and logged; a value this server cannot
    honour is refused, naming the flag."""
    args = parse_args(["serve", "m", "--attention-backend", "TRITON_ATTN", "--disable-custom-all-reduce",
                       "--swap-space", "4", "--disable-log-requests", "--task", "generate",
                       "--distributed-executor-backend", "mp", "--tokenizer-mode", "auto"])
    check_vllm_flags(args)
    logged = capsys.readouterr().out
    assert "--disable-custom-all-reduce: no effect here" in logged and "--attention-backend TRITON_ATTN" in logged
    assert build_engine_args(args).model == "m"
    for flag, value in (("--runner", "draft"), ("--tokenizer-mode", "mistral")):
        with pytest.raises(ValueError, match=f"{flag} '{value}' is not supported; supported: "):
            check_vllm_flags(parse_args(["serve", "m", flag, value]))
    check_vllm_flags(parse_args(["serve", "m"]))  # none given: nothing to say
    # --distributed-executor-backend is an engine flag (mp or ray), no longer a no-op.
    ray_args = parse_args(["serve", "m", "--distributed-executor-backend", "ray"])
    assert build_engine_args(ray_args).distributed_executor_backend == "ray"


def test_model_is_optional_and_flag_form_agrees():
    assert parse_args(["serve"]).model is None
    assert parse_args(["serve", "--enable-prefix-caching"]).enable_prefix_caching is True
    assert parse_args(["serve", "--model", "a"]).model == "a"
    assert parse_args(["serve", "a", "--model", "a"]).model == "a"
    with pytest.raises(SystemExit):
        parse_args(["serve", "a", "--model", "b"])
    with pytest.raises(SystemExit):
        parse_args([])
    with pytest.raises(SystemExit):
        parse_args(["serve", "--port", "not-a-port"])


def test_chat_template_file_or_inline(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert load_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert load_chat_template("{% for m in messages %}{% endfor %}").startswith("{%")
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))


@pytest.mark.default_model
def test_serve_default_model_smoke():
    """`vllm-volta serve` with no MODEL answers a chat request with the default model."""
    launcher = [sys.executable, "-c", "from vllm_volta.entrypoints.cli import main; main()",
                "serve"]
    with RemoteServer(["--max-model-len", "512"], launcher=launcher) as server:
        client = server.client()
        (model,) = client.models.list().data
        assert model.id == "SmolLM2-135M-Instruct"
        resp = client.chat.completions.create(
            model=model.id, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
        assert "Paris" in resp.choices[0].message.content
        assert resp.choices[0].finish_reason == "stop"
