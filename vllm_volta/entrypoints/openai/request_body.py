"""Reading a request body into its pydantic model off the event loop.

A body of megabytes (a 5 MB prompt, a long list of token ids) takes tens to hundreds of
milliseconds to parse and validate; done on the event loop it would stall every other
request, /health included. The body is read asynchronously, then parsed and validated in a
worker thread. Text that JSON can carry but that is not valid Unicode (a lone UTF-16
surrogate such as ``"\\ud800"``) is refused here with a 400 naming the field, before any
tokenizer sees it.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from vllm_volta.entrypoints.openai.errors import OpenAIError

M = TypeVar("M", bound=BaseModel)

# Host-side request work (parsing, chat templates, tokenization, detokenization) runs here.
# A few threads: the work holds the interpreter lock much of the time, so more would not help.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vllm-volta-host")


async def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in the host-work thread pool, awaited from the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, lambda: fn(*args, **kwargs))


def _path(parts: list[Any]) -> str:
    return ".".join(str(p) for p in parts) or "body"


def first_invalid_text(data: Any) -> tuple[str, str] | None:
    """(field path, the offending text) of the first string (or key) in ``data`` that is
    not valid Unicode, or None. Iterative, so deeply nested JSON cannot overflow."""
    stack: list[tuple[Any, list[Any]]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as exc:
                return _path(path), node[exc.start:exc.end]
        elif isinstance(node, dict):
            for key, value in node.items():
                stack.append((key, path))
                stack.append((value, [*path, key]))
        elif isinstance(node, list):
            stack.extend((value, [*path, i]) for i, value in enumerate(node))
    return None


def parse_json_body(body: bytes, model: type[M]) -> M:
    """``model`` from the raw body: 400 for invalid JSON or text, RequestValidationError
    (400 naming the field) for a body that does not fit the model."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise OpenAIError("Invalid JSON body: nested too deeply", 400) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAIError(f"Invalid JSON body: {exc}", 400) from None
    bad = first_invalid_text(data)
    if bad is not None:
        field, text = bad
        raise OpenAIError(f"{field}: the text holds {text.encode('unicode_escape').decode()}, "
                          "a lone UTF-16 surrogate, which is not valid Unicode text", 400, field)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
    except RecursionError:
        raise OpenAIError("Invalid JSON body: nested too deeply", 400) from None


async def read_request(raw_request: Request, model: type[M]) -> M:
    """The request's body as ``model``, parsed and validated off the event loop."""
    body = await raw_request.body()
    return await off_loop(parse_json_body, body, model)
