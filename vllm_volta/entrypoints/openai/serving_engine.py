"""What every OpenAI endpoint shares: model-name checks, prompt tokenization and
length checks, SamplingParams construction, and running requests on AsyncLLM
(including abort on client disconnect)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from vllm_volta.engine.async_llm import AsyncLLM, RequestError, RequestStream
from vllm_volta.engine.engine_errors import EngineDeadError, ServerShuttingDown
from vllm_volta.entrypoints.openai.errors import OpenAIError, error_body
from vllm_volta.sampling_params import SamplingParams

# Logprobs of -inf are not valid JSON; clients get vLLM's floor instead.
LOGPROB_FLOOR = -9999.0
# Normalizers can shorten text (NFKC folds some sequences), so the token count bound taken
# from the text's bytes is loosened by this factor before a prompt is refused untokenized.
_NORMALIZE_SLACK = 4


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most UTF-8 bytes any vocabulary entry spells (a byte-level or SentencePiece token
    never covers more bytes of the text than its own string has), or None without one."""
    if tokenizer is None:
        return None
    try:
        return max((len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()),
                   default=None)
    except Exception:  # a tokenizer without a readable vocabulary: no early bound
        return None


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def clamp_logprob(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


class OpenAIServing:
    """Base of the completion/chat/tokenization handlers."""

    def __init__(self, engine: AsyncLLM, served_model_names: list[str], *,
                 max_model_len: int, vocab_size: int, max_logprobs: int = 20) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs
        self.tokenizer = engine.get_tokenizer()
        self._token_bytes = max_token_bytes(self.tokenizer)
        # The model's recommended sampling defaults (--generation-config), for unset fields.
        model_config = getattr(engine, "model_config", None)
        self.default_sampling = (model_config.get_diff_sampling_param() if model_config is not None
                                 else {})

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, model: str | None) -> None:
        """404 unless ``model`` is one of the served names (None means the default)."""
        if model is not None and model not in self.served_model_names:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")

    def check_logprobs(self, value: int | None, param: str) -> None:
        if value is not None and value > self.max_logprobs:
            raise OpenAIError(f"{param} must be between 0 and {self.max_logprobs}, got {value}",
                              400, param)

    def check_token_ids(self, ids: list[int], param: str) -> list[int]:
        """400 unless every id is inside the vocabulary (the model would index out of range)."""
        for tok in ids:
            if not 0 <= tok < self.vocab_size:
                raise OpenAIError(f"Token id {tok} is out of vocabulary "
                                  f"(allowed 0..{self.vocab_size - 1})", 400, param)
        return list(ids)

    def check_text_length(self, text: str, param: str = "prompt") -> None:
        """400 before tokenizing when the text cannot fit max_model_len: it holds more bytes
        than max_model_len of the vocabulary's longest tokens could spell."""
        if self._token_bytes is None:
            return
        limit = self.max_model_len * self._token_bytes * _NORMALIZE_SLACK
        if len(text) > limit // 4 and len(text.encode("utf-8", "surrogatepass")) > limit:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt has {len(text)} characters, more than that many tokens can hold. "
                "Please reduce the length of the prompt.", 400, param)

    def tokenize(self, prompt: str | list[int], add_special_tokens: bool,
                 param: str = "prompt") -> list[int]:
        """Token ids of a prompt (text or ids); ids are checked against the vocabulary.
        Blocking: handlers call it through ``off_loop``."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise OpenAIError("text prompts need a tokenizer; this server was started with "
                                  "--skip-tokenizer-init, so send token ids", 400, "prompt")
            self.check_text_length(prompt, param)
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        else:
            ids = self.check_token_ids(prompt, "prompt")
        if not ids:
            raise OpenAIError("The prompt is empty after tokenization", 400, "prompt")
        return ids

    def resolve_max_tokens(self, num_prompt_tokens: int, requested: int | None,
                           param: str = "max_tokens") -> int:
        """The number of tokens to generate; 400 when prompt + completion overflow."""
        room = self.max_model_len - num_prompt_tokens
        if requested is None:
            if room <= 0:
                raise OpenAIError(
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, your prompt has {num_prompt_tokens} tokens. Please reduce the "
                    "length of the prompt.", 400, "prompt")
            return min(room, self.default_sampling.get("max_tokens", room))
        if requested > room:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {num_prompt_tokens + requested} tokens "
                f"({num_prompt_tokens} in the prompt, {requested} in the completion). "
                "Please reduce the length of the prompt or completion.", 400, param)
        return requested

    def make_sampling_params(self, renames: dict[str, str] | None = None,
                             **kwargs: Any) -> SamplingParams:
        """SamplingParams of the request's fields over the model's defaults, with its
        ValueErrors turned into 400s.

        SamplingParams' messages start with the field name; ``renames`` maps a field
        to the request parameter that set it (e.g. logprobs -> top_logprobs).
        """
        try:
            return SamplingParams(**{**self.default_sampling, **kwargs})
        except (ValueError, TypeError) as exc:
            field = str(exc).split(" ", 1)[0]
            param = (renames or {}).get(field, field) if field in kwargs else None
            raise OpenAIError(str(exc), 400, param) from exc

    def prompt_logprobs_json(self, steps: list[Any] | None) -> list[Any] | None:
        """vLLM's prompt_logprobs field: per prompt token (the first: null) its top tokens and
        itself, {token id: {logprob, rank, decoded_token}}."""
        if steps is None:
            return None
        return [None if step is None else {
            str(t): {"logprob": clamp_logprob(lp.logprob), "rank": lp.rank,
                     "decoded_token": self.decode_token(t, lp)} for t, lp in step.items()}
            for step in steps]

    def decode_token(self, token_id: int, logprob: Any = None) -> str:
        text = getattr(logprob, "decoded_token", None)
        if text is None:
            text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""
        return text

    async def add_requests(self, request_id: str, prompts: list[list[int]],
                           params: SamplingParams) -> list[RequestStream]:
        """Add one engine request per prompt; on any failure none stays in the engine."""
        streams: list[RequestStream] = []
        try:
            for i, ids in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(await self.engine.add_request(rid, ids, params))
        except ValueError as exc:
            for s in streams:
                s.close()
            # The engine's checks start with the field they are about ("logit_bias: ...").
            field = str(exc).split(":", 1)[0]
            raise OpenAIError(str(exc), 400, field if hasattr(params, field) else None) from exc
        except BaseException:
            for s in streams:
                s.close()
            raise
        return streams


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several request streams as (prompt index, RequestOutput).

    Leaving early (error, cancellation, close) aborts every unfinished request.
    """
    if len(streams) == 1:  # the common case: no relay task and queue per output
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].close()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def drain(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
            queue.put_nowait((i, done))
        except Exception as exc:  # forwarded to the consumer
            queue.put_nowait((i, exc))

    tasks = [asyncio.ensure_future(drain(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.close()


async def _wait_for_disconnect(raw_request: Request) -> None:
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect_final(streams: list[RequestStream],
                        raw_request: Request | None) -> list[Any]:
    """Run the requests to completion; abort them if the client goes away first."""
    finals: list[Any] = [None] * len(streams)

    async def consume() -> None:
        async for i, out in merge_streams(streams):
            finals[i] = out

    consumer = asyncio.ensure_future(consume())
    if raw_request is None:
        await consumer
        return finals
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
    try:
        await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not consumer.done():
            consumer.cancel()
            for s in streams:
                s.close()
    if not consumer.done() or consumer.cancelled():
        # The client left first: let the cancelled consumer finish (it has no result to read).
        await asyncio.gather(consumer, return_exceptions=True)
        raise OpenAIError("Client disconnected", 499)
    try:
        consumer.result()
    except RequestError as exc:  # the engine rejected this request's input
        raise OpenAIError(str(exc), 400) from exc
    return finals


def now_s() -> int:
    return int(time.time())


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


class ChunkEncoder:
    """Server-sent events of one stream's chunks. The fields every chunk repeats (id, object,
    created, model) are serialized once; each call adds the fields that change. The JSON is
    what ``sse`` gives for the whole dict, with the repeated fields first."""

    def __init__(self, head: dict[str, Any]) -> None:
        if not head:
            raise ValueError("ChunkEncoder needs the chunks' repeated fields")
        self._prefix = "data: " + json.dumps(head, ensure_ascii=False)[:-1] + ", "

    def __call__(self, **fields: Any) -> str:
        return self._prefix + json.dumps(fields, ensure_ascii=False)[1:] + "\n\n"


def stream_error(exc: Exception) -> str:
    """An error met after the stream started: sent as an event (headers are gone)."""
    if isinstance(exc, OpenAIError):
        status = exc.status
    elif isinstance(exc, (EngineDeadError, ServerShuttingDown)):
        status = 503  # not the request's fault: retry elsewhere or later
    else:  # RequestError (bad input found by the engine) is a ValueError
        status = 400 if isinstance(exc, ValueError) else 500
    return sse(error_body(str(exc), status))


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
