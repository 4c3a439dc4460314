"""POST /tokenize and /detokenize, with vLLM's request and response shapes."""

from __future__ import annotations

from typing import Any

from vllm_volta.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from vllm_volta.entrypoints.openai.serving_chat import OpenAIServingChat


class OpenAIServingTokenization(OpenAIServingChat):
    """Tokenize a prompt or a chat conversation; detokenize ids."""

    def tokenize_request(self, request: TokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        if request.messages is not None:
            text = self.render_chat(request.messages,
                                    add_generation_prompt=request.add_generation_prompt,
                                    continue_final_message=request.continue_final_message,
                                    chat_template=request.chat_template)
            # The chat template writes its own special tokens.
            add_special = bool(request.add_special_tokens)
        else:
            text = request.prompt or ""
            add_special = request.add_special_tokens is not False
        ids = list(self.tokenizer.encode(text, add_special_tokens=add_special))
        token_strs = self.tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs \
            else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                "token_strs": token_strs}

    def detokenize_request(self, request: DetokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        ids = self.check_token_ids(request.tokens, "tokens")
        return {"prompt": self.tokenizer.decode(ids)}
