"""Fixtures: one tiny random Llama (with its HF reference) and one server for the session."""

from __future__ import annotations

import pytest

from test_v100.entrypoints.openai.utils import RemoteServer, build_tiny_llama

MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 128
MAX_NUM_SEQS = 16

# A small KV pool (the tiny model needs few bytes per token) and a batch cap below the
# 64-request concurrency test, so that test also exercises the scheduler's waiting queue.
SERVER_ARGS = ["--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
               "--max-num-seqs", str(MAX_NUM_SEQS), "--cpu-kvcache-space", "0.01",
               "--seed", "0", "--dtype", "float32"]  # the references are fp32 (GPU "auto" is fp16)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="session")
def hf_reference(tiny_model: str):
    """(tokenizer, model) from transformers on the same files: the independent reference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    return tok, model


@pytest.fixture(scope="session", params=["--no-engine-process", "--engine-process"],
                ids=["in-process", "engine-process"])
def server(tiny_model: str, request: pytest.FixtureRequest):
    """The server with the engine in its process (the CPU default) and in a process of its
    own (the GPU default): every endpoint test runs against both."""
    with RemoteServer(["--model", tiny_model, *SERVER_ARGS, request.param]) as srv:
        yield srv


@pytest.fixture
def client(server: RemoteServer):
    return server.client()
