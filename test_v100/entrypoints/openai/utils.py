"""Test helpers: a tiny random-weight Llama with a real tokenizer, and a real server process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = (
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog. "
    "Volta GPUs run half precision fast. A paged KV cache stores keys and values in blocks. "
    "Hello world, hello server, hello client! Numbers 0123456789 and symbols: ,.;:?!-()[]{}\n"
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def build_tiny_llama(path: Path, vocab_size: int = 384, seed: int = 0) -> Path:
    """Save a 2-layer random Llama plus a byte-level BPE tokenizer with a ChatML template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Only the corpus's ASCII characters form the alphabet: every token then decodes to
    # ASCII, so random generations never hold partial UTF-8 sequences.
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS] * 20, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                     eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     unk_token="<|endoftext|>")
    hf_tok.chat_template = CHATML_TEMPLATE
    hf_tok.save_pretrained(path)

    config = LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=False,
        initializer_range=0.2, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteServer:
    """The server on 127.0.0.1 and a free port, started by ``launcher`` (default:
    ``python -m vllm_volta.entrypoints.openai.api_server``) with ``args``."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 startup_timeout: float = 240.0, launcher: list[str] | None = None) -> None:
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm_volta_server_{self.port}.log"
        full_env = {**os.environ, **(env or {})}
        launcher = launcher or [sys.executable, "-m", "vllm_volta.entrypoints.openai.api_server"]
        cmd = [*launcher, "--host", "127.0.0.1", "--port", str(self.port),
               "--uvicorn-log-level", "warning", *args]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=full_env)
        try:
            self._wait_ready(startup_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self, tail: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-tail:]

    def client(self, api_key: str = "EMPTY", **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                             **kwargs)

    def async_client(self, api_key: str = "EMPTY", **kwargs):
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                                  **kwargs)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_metrics(text: str) -> dict[str, float]:
    """{'name{labels}': value} for every sample line of a Prometheus text page."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


def metric(text: str, name: str) -> float:
    """The value of the (single) sample of ``name``, whatever its labels."""
    for key, value in parse_metrics(text).items():
        if key == name or key.startswith(name + "{"):
            return value
    raise KeyError(name)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by transformers (ignoring EOS), the reference for the server."""
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=model.config.pad_token_id)
    return out[0, len(prompt_ids):].tolist()


def hf_logprobs(model, prompt_ids: list[int], gen_ids: list[int]) -> list[list[float]]:
    """Log-softmax rows predicting each generated token (and each prompt token after the
    first): row i holds the distribution over the vocab for position i + 1."""
    import torch

    ids = torch.tensor([prompt_ids + gen_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1].tolist()
