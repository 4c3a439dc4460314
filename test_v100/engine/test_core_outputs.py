"""Delta outputs on the engine core's pipe (core_outputs.py): what the client rebuilds equals
the engine's own cumulative RequestOutputs (token ids, text, logprobs, finish state), step by
step and when steps are coalesced."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from test_v100.entrypoints.openai.utils import build_tiny_llama
from vllm_volta.core.request import Request, RequestStatus
from vllm_volta.core.request_group import RequestGroup
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.core_outputs import OutputDecoder, OutputEncoder
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.outputs import RequestOutput
from vllm_volta.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tiny_llama_outputs"))
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), max_model_len=96, max_num_seqs=8, cpu_kvcache_space=0.01,
        seed=0, dtype="float32", max_num_batched_tokens=16))  # small chunks: multi-step prefill
    yield engine
    engine.shutdown()


REQUESTS = {
    "plain": ("Hello world", SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)),
    "n2-logprobs": ("The quick brown fox", SamplingParams(
        n=2, temperature=1.0, seed=3, max_tokens=7, logprobs=2, prompt_logprobs=1,
        ignore_eos=True)),
    "stop-string": ("Numbers 0123", SamplingParams(temperature=0, max_tokens=12, stop=["GPU"],
                                                   ignore_eos=True)),
}


LIVE = {*REQUESTS, "a"}  # the requests in flight (none was aborted)


def _without_prompt(out: RequestOutput) -> RequestOutput:
    return dataclasses.replace(out, prompt=None, prompt_token_ids=None)


def _steps(engine: LLMEngine) -> list[list[tuple[RequestOutput, tuple]]]:
    """Per step, each advanced request's cumulative output (the reference) and its wire item,
    both built from the same state by one output_builder."""
    encoder = OutputEncoder()
    # Deep copies: the reference must not change under later steps.
    engine.output_builder = lambda group: (pickle.loads(pickle.dumps(group.make_output())),
                                           pickle.loads(pickle.dumps(encoder.encode(group))))
    try:
        for rid, (prompt, params) in REQUESTS.items():
            engine.add_request(rid, prompt, params)
        steps = []
        while engine.has_unfinished_requests():
            steps.append(engine.step())
    finally:
        engine.output_builder = RequestGroup.make_output
    assert not encoder._sent  # finished requests are dropped
    return steps


def test_every_step_rebuilds_the_engines_cumulative_output(engine):
    steps = _steps(engine)
    assert len(steps) > 5
    decoder = OutputDecoder()
    seen_deltas = 0
    for step in steps:
        outputs = [out for out, _ in step]
        wire = [item for _, item in step]
        seen_deltas += sum(len(c[1]) < len(o.outputs[i].token_ids)
                           for item, o in zip(wire, outputs) for i, c in enumerate(item[6]))
        touched: dict = {}
        decoder.apply(wire, touched, LIVE)
        rebuilt = [decoder.build(rid, state) for rid, state in touched.items()]
        assert rebuilt == [_without_prompt(o) for o in outputs]
    assert seen_deltas > 0  # later outputs carried only their new tokens
    assert not decoder._states  # finished requests are dropped
    finals = {o.request_id: o for step in steps for o, _ in step if o.finished}
    assert finals["n2-logprobs"].prompt_logprobs is not None
    assert len(finals["n2-logprobs"].outputs[1].logprobs) == 7
    # A 3-character stop string: the text's last 2 characters are held back while it runs.
    assert finals["stop-string"].outputs[0].stop_reason == "GPU"
    assert "GPU" not in finals["stop-string"].outputs[0].text


def test_coalesced_steps_give_the_newest_output(engine):
    steps = _steps(engine)
    decoder = OutputDecoder()
    touched: dict = {}
    newest: dict[str, RequestOutput] = {}
    for step in steps[:-1]:  # the client falls behind: all but the last step at once
        decoder.apply([item for _, item in step], touched, LIVE)
        newest.update((o.request_id, o) for o, _ in step)
    rebuilt = {rid: decoder.build(rid, state) for rid, state in touched.items()}
    assert rebuilt == {rid: _without_prompt(o) for rid, o in newest.items()}


def _group(rid: str, token_ids: list[int], finished: bool = False) -> RequestGroup:
    """A request (no tokenizer) whose output so far is `token_ids`."""
    request = Request(rid, [9, 9], SamplingParams(), max_tokens=16, block_size=16)
    request.output_token_ids = list(token_ids)
    if finished:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    return RequestGroup(rid, None, [9, 9], SamplingParams(), [request], None, None, 0.0)


def test_a_shorter_history_is_sent_whole_and_aborts_are_forgotten():
    encoder, decoder = OutputEncoder(), OutputDecoder()
    for ids in ([1, 2, 3], [1, 2], [1, 2, 7, 8]):
        touched: dict = {}
        group = _group("a", ids)
        decoder.apply([encoder.encode(group)], touched, LIVE)
        assert decoder.build("a", touched["a"]) == _without_prompt(group.make_output())
    encoder.forget(["a"])
    decoder.forget(["a"])
    touched = {}
    decoder.apply([encoder.encode(_group("a", [5], finished=True))], touched, LIVE)
    out = decoder.build("a", touched["a"])
    assert out.outputs[0].token_ids == [5] and out.finished
    assert out.outputs[0].finish_reason == "length"


def test_outputs_of_a_request_no_longer_in_flight_are_dropped():
    # An aborted request's outputs may still be on the pipe: they must not bring it back.
    encoder, decoder = OutputEncoder(), OutputDecoder()
    touched: dict = {}
    decoder.apply([encoder.encode(_group("gone", [1, 2])), encoder.encode(_group("kept", [3]))],
                  touched, live={"kept"})
    assert list(touched) == ["kept"] and list(decoder._states) == ["kept"]
