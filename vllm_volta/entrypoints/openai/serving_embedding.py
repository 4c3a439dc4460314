"""POST /v1/embeddings: OpenAI's embeddings API over the engine's embedding requests
(PoolingParams: the last token's final hidden state, normalized)."""

from __future__ import annotations

import base64

import numpy as np
from fastapi.responses import JSONResponse
from starlette.requests import Request

from vllm_volta.entrypoints.openai.errors import OpenAIError
from vllm_volta.entrypoints.openai.protocol import EmbeddingRequest
from vllm_volta.entrypoints.openai.request_body import off_loop
from vllm_volta.entrypoints.openai.serving_engine import OpenAIServing, collect_final, now_s, random_id
from vllm_volta.pooling_params import PoolingParams


def encode_embedding(vec: list[float], encoding_format: str) -> list[float] | str:
    """A list of floats, or base64 of its little-endian float32 bytes (what the openai client
    asks for by default and decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return vec


class OpenAIServingEmbedding(OpenAIServing):
    """Handler of /v1/embeddings."""

    async def create_embedding(self, request: EmbeddingRequest, raw_request: Request | None = None) -> JSONResponse:
        self.check_model(request.model)
        prompt_ids = await off_loop(
            lambda: [self.tokenize(p, request.add_special_tokens, "input") for p in request.inputs()])
        for ids in prompt_ids:
            if len(ids) > self.max_model_len:
                raise OpenAIError(f"This model's maximum context length is {self.max_model_len} tokens. "
                                  f"However, an input has {len(ids)} tokens.", 400, "input")
        try:
            params = PoolingParams(dimensions=request.dimensions)
        except ValueError as exc:
            raise OpenAIError(str(exc), 400, "dimensions") from exc
        request_id = random_id("embd")
        finals = await collect_final(await self.add_requests(request_id, prompt_ids, params), raw_request)
        num_tokens = sum(len(ids) for ids in prompt_ids)
        data = [{"object": "embedding", "index": i, "embedding": encode_embedding(out.embedding, request.encoding_format)}
                for i, out in enumerate(finals)]
        return JSONResponse({"id": request_id, "object": "list", "created": now_s(), "model": self.model_name,
                             "data": data, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})
