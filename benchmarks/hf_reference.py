"""The Hugging Face ``transformers`` side of --compare-hf / --backend hf.

Builds the same model shape in the same dtype on the same device, with random weights drawn
the way our dummy load draws them (uniform in [-1e-3, 1e-3], seeded; RMSNorm weights 1), or
real weights when the engine loads real ones, and runs batched ``generate`` forced to exact output lengths.
"""
from __future__ import annotations

import gc
import zlib
from typing import Sequence

import torch

from benchmarks.utils import log

DUMMY_LOW, DUMMY_HIGH = -1e-3, 1e-3


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded uniform(-1e-3, 1e-3) for every weight, norm weights 1 - as our dummy loader does.

    Small weights keep fp16 activations finite, so sampling never meets inf/NaN logits.
    """
    norms = {id(m.weight) for m in model.modules()
             if type(m).__name__.endswith("RMSNorm") and isinstance(m.weight, torch.Tensor)}
    for name, param in model.named_parameters():
        if not param.dtype.is_floating_point:
            continue
        if id(param) in norms:
            param.fill_(1.0)
            continue
        gen = torch.Generator(device=param.device)
        gen.manual_seed(seed + zlib.crc32(name.encode()))
        # Draw in fp32 then cast: uniform_ on low-precision tensors is not supported everywhere.
        tmp = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        tmp.uniform_(DUMMY_LOW, DUMMY_HIGH, generator=gen)
        param.copy_(tmp)


def build_hf_model(model: str, *, dtype: torch.dtype, device: torch.device,
                   load_format: str, seed: int) -> torch.nn.Module:
    """A transformers CausalLM of ``model``'s config; random weights when load_format is dummy."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format == "dummy":
        config = AutoConfig.from_pretrained(model)
        # Allocate straight on the device: an 8B model should not take a CPU round trip.
        with torch.device(device):
            hf_model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        init_dummy_weights(hf_model, seed)
    else:
        hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    return hf_model.eval()


class HFRunner:
    """Batched ``generate`` over token-id prompts, every sequence forced to ``output_len``."""

    name = "hf"

    def __init__(self, model: str, *, dtype: torch.dtype, device: torch.device,
                 load_format: str, seed: int, batch_size: int,
                 temperature: float = 1.0) -> None:
        if batch_size < 1:
            raise ValueError(f"hf_batch_size must be >= 1, got {batch_size}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size
        self.temperature = temperature
        log(f"building transformers model {model} ({dtype}, {device}, load_format={load_format})")
        self.model = build_hf_model(model, dtype=dtype, device=device,
                                    load_format=load_format, seed=seed)

    @torch.no_grad()
    def _generate_batch(self, prompts: Sequence[Sequence[int]], output_len: int) -> list[int]:
        lengths = {len(p) for p in prompts}
        if len(lengths) != 1:
            raise ValueError("HF reference batches need prompts of one length (no padding)")
        input_ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        sampling = ({"do_sample": True, "temperature": self.temperature, "top_p": 1.0, "top_k": 0}
                    if self.temperature > 0 else {"do_sample": False})
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=output_len,
            min_new_tokens=output_len,  # suppresses EOS: exact lengths, like ignore_eos
            pad_token_id=0,
            use_cache=True,
            **sampling,
        )
        new_tokens = out.shape[1] - input_ids.shape[1]
        return [new_tokens] * len(prompts)

    def generate(self, prompts: Sequence[Sequence[int]], output_len: int) -> list[int]:
        """Generate for all prompts in batches of ``batch_size``; returns output lengths."""
        lens: list[int] = []
        for start in range(0, len(prompts), self.batch_size):
            lens.extend(self._generate_batch(prompts[start:start + self.batch_size], output_len))
        return lens

    def close(self) -> None:
        """Free the model's device memory before another backend needs it."""
        del self.model
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
