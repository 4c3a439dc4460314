"""The chunk policy changes how a long prompt is split, never what the model generates: greedy
tokens of a long prompt prefilled beside a decode stream match with and without the attention
cost cap (and the long_prefill_token_threshold), and match transformers."""
from __future__ import annotations

import pytest

from test_v100.worker.tiny_models import hf_greedy, random_prompts, save_tiny_model
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.sampling_params import SamplingParams

MAX_LEN = 1024
BUDGET = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("chunk_policy_llama")
    model = save_tiny_model(path, "llama", max_position_embeddings=MAX_LEN)
    return path, model


def _run(path, stream_prompt, long_prompt, **policy):
    """Greedy tokens of the long prompt, and the long prompt's chunk sizes step by step."""
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), max_model_len=MAX_LEN, max_num_batched_tokens=BUDGET, cpu_kvcache_space=0.02,
        skip_tokenizer_init=True, dtype="float32", enable_prefix_caching=False, **policy))
    sizes: list[int] = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        sizes.extend(s.num_new_tokens for s in out.scheduled if s.req_id == "long")
        return out

    engine.scheduler.schedule = recording_schedule
    engine.add_request("stream", stream_prompt, SamplingParams(
        temperature=0, ignore_eos=True, detokenize=False, max_tokens=200))
    engine.step()
    engine.step()  # the stream decodes from here on
    engine.add_request("long", long_prompt, SamplingParams(
        temperature=0, ignore_eos=True, detokenize=False, max_tokens=4))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "long" and out.finished:
                tokens["long"] = list(out.outputs[0].token_ids)
                engine.abort_request(["stream"])  # the stream's own tokens are not compared
    engine.shutdown()
    return tokens, sizes


def test_long_prompt_tokens_unchanged_by_the_chunk_policy(tiny):
    path, hf_model = tiny
    stream_prompt, long_prompt = random_prompts(1, 8, 8, seed=3)[0], random_prompts(1, 400, 400, seed=4)[0]
    capped, capped_sizes = _run(path, stream_prompt, long_prompt, prefill_attention_reference_len=16)
    uncapped, uncapped_sizes = _run(path, stream_prompt, long_prompt, prefill_attention_reference_len=0)
    threshold, threshold_sizes = _run(path, stream_prompt, long_prompt, prefill_attention_reference_len=0,
                                      long_prefill_token_threshold=24)
    # The policies did split the prompt differently (beside the decode: BUDGET - 1 tokens a step
    # uncapped; <= 24; shrinking with the context under the cost cap) ...
    assert uncapped_sizes[:3] == [BUDGET - 1] * 3
    assert max(threshold_sizes) == 24
    body = capped_sizes[:-1]  # the last chunk is whatever is left
    assert body == sorted(body, reverse=True) and body[-1] < body[1] < BUDGET - 1
    assert len(capped_sizes) > 2 * len(uncapped_sizes)
    # ... and generated the same tokens, transformers' tokens.
    assert capped == uncapped == threshold == {"long": hf_greedy(hf_model, long_prompt, 4)}
