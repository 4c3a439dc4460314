"""benchmarks/hf_reference.py: random-weight HF models and exact-length batched generate."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from benchmarks.hf_reference import DUMMY_HIGH, DUMMY_LOW, HFRunner, build_hf_model
from benchmarks.utils import CONFIGS_DIR

TINY = str(CONFIGS_DIR / "tiny-llama")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dummy_model_dtype_device_range_and_seed(device, dtype):
    a = build_hf_model(TINY, dtype=dtype, device=torch.device(device), load_format="dummy",
                       seed=1)
    b = build_hf_model(TINY, dtype=dtype, device=torch.device(device), load_format="dummy",
                       seed=1)
    c = build_hf_model(TINY, dtype=dtype, device=torch.device(device), load_format="dummy",
                       seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert pa.dtype == dtype and pa.device.type == device, name
        if "norm" in name:  # RMSNorm weights are 1, as in our dummy loader
            assert torch.all(pa == 1), name
            continue
        bound = DUMMY_HIGH * (1 + torch.finfo(dtype).eps)  # fp16 rounding of the edges
        assert -bound <= pa.min().item() and pa.max().item() <= bound, name
        assert pa.min().item() < 0.5 * DUMMY_LOW and pa.max().item() > 0.5 * DUMMY_HIGH, name
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
    # Parameters are independent draws, not copies of one tensor.
    q = a.model.layers[0].self_attn.q_proj.weight
    o = a.model.layers[0].self_attn.o_proj.weight
    assert not torch.equal(q, o)


def _eos_always_model(device: str) -> tuple[torch.nn.Module, int]:
    """A model whose greedy choice is always token 0, made the EOS token."""
    cfg = AutoConfig.from_pretrained(TINY)
    cfg.eos_token_id = 0
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # all logits tie; argmax picks id 0
    model.generation_config.eos_token_id = 0
    return model.eval(), cfg.vocab_size


@pytest.mark.parametrize("device", DEVICES)
def test_runner_forces_exact_lengths_past_eos(device):
    model, vocab = _eos_always_model(device)
    prompts = [[5, 6, 7, 8]] * 3
    ids = torch.tensor(prompts, device=device)
    # Reference behaviour: plain generate stops at the EOS it produces first.
    plain = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                           do_sample=False, pad_token_id=0)
    assert plain.shape[1] - ids.shape[1] == 1

    runner = HFRunner(TINY, dtype=torch.float32, device=torch.device(device),
                      load_format="dummy", seed=0, batch_size=2, temperature=0.0)
    runner.model = model
    assert runner.generate(prompts, 6) == [6, 6, 6]


def test_runner_batches_sampling_and_validation():
    runner = HFRunner(TINY, dtype=torch.float32, device=torch.device("cpu"),
                      load_format="dummy", seed=0, batch_size=4, temperature=1.0)
    calls = []
    inner = runner.model.generate

    def recording_generate(**kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return inner(**kwargs)

    runner.model.generate = recording_generate
    prompts = [[i, i + 1, i + 2] for i in range(10)]
    assert runner.generate(prompts, 3) == [3] * 10
    assert calls == [4, 4, 2]
    with pytest.raises(ValueError, match="one length"):
        runner.generate([[1, 2], [1, 2, 3]], 2)
    with pytest.raises(ValueError, match="hf_batch_size"):
        HFRunner(TINY, dtype=torch.float32, device=torch.device("cpu"), load_format="dummy",
                 seed=0, batch_size=0)
    runner.close()
    assert not hasattr(runner, "model")
