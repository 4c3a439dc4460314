"""Delta outputs on the engine core's pipe (core_outputs.py): what the client rebuilds equals
the engine's own cumulative RequestOutputs, step by step and when steps are coalesced."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from test_v100.entrypoints.openai.utils import build_tiny_llama
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.core_outputs import OutputDecoder, OutputEncoder
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.outputs import CompletionOutput, RequestOutput
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
    "stop-string": ("Numbers 0123", SamplingParams(temperature=0, max_tokens=12, stop=["a"],
                                                   ignore_eos=True)),
}


LIVE = {*REQUESTS, "a"}  # the requests in flight (none was aborted)


def _without_prompt(out: RequestOutput) -> RequestOutput:
    return dataclasses.replace(out, prompt=None, prompt_token_ids=None)


def _steps(engine: LLMEngine) -> list[list[RequestOutput]]:
    for rid, (prompt, params) in REQUESTS.items():
        engine.add_request(rid, prompt, params)
    steps = []
    while engine.has_unfinished_requests():
        # Deep copies: the reference must not change under later steps.
        steps.append(pickle.loads(pickle.dumps(engine.step())))
    return steps


def test_every_step_rebuilds_the_engines_cumulative_output(engine):
    steps = _steps(engine)
    assert len(steps) > 5
    encoder, decoder = OutputEncoder(), OutputDecoder()
    seen_deltas = 0
    for outputs in steps:
        wire = pickle.loads(pickle.dumps(encoder.encode(outputs)))  # as the pipe carries it
        seen_deltas += sum(len(c[1]) < len(o.outputs[i].token_ids)
                           for item, o in zip(wire, outputs) for i, c in enumerate(item[6]))
        touched: dict = {}
        decoder.apply(wire, touched, LIVE)
        rebuilt = [decoder.build(rid, state) for rid, state in touched.items()]
        assert rebuilt == [_without_prompt(o) for o in outputs]
    assert seen_deltas > 0  # later outputs carried only their new tokens
    assert not encoder._sent and not decoder._states  # finished requests are dropped
    finals = {o.request_id: o for step in steps for o in step if o.finished}
    assert finals["n2-logprobs"].prompt_logprobs is not None
    assert len(finals["n2-logprobs"].outputs[1].logprobs) == 7


def test_coalesced_steps_give_the_newest_output(engine):
    steps = _steps(engine)
    encoder, decoder = OutputEncoder(), OutputDecoder()
    touched: dict = {}
    newest: dict[str, RequestOutput] = {}
    for outputs in steps[:-1]:  # the client falls behind: all but the last step at once
        decoder.apply(encoder.encode(outputs), touched, LIVE)
        newest.update((o.request_id, o) for o in outputs)
    rebuilt = {rid: decoder.build(rid, state) for rid, state in touched.items()}
    assert rebuilt == {rid: _without_prompt(o) for rid, o in newest.items()}


def _output(rid: str, token_ids: list[int], text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(rid, None, None, None, [CompletionOutput(0, text, token_ids, None, None)],
                         finished=finished)


def test_a_shorter_history_is_sent_whole_and_aborts_are_forgotten():
    encoder, decoder = OutputEncoder(), OutputDecoder()
    for out in (_output("a", [1, 2, 3], "abc"), _output("a", [1, 2], "ab"),
                _output("a", [1, 2, 7, 8], "abgh")):
        touched: dict = {}
        decoder.apply(encoder.encode([out]), touched, LIVE)
        assert decoder.build("a", touched["a"]) == out
    encoder.forget(["a"])
    decoder.forget(["a"])
    touched = {}
    decoder.apply(encoder.encode([_output("a", [5], "e", finished=True)]), touched, LIVE)
    assert decoder.build("a", touched["a"]).outputs[0].token_ids == [5]


def test_outputs_of_a_request_no_longer_in_flight_are_dropped():
    # An aborted request's outputs may still be on the pipe: they must not bring it back.
    encoder, decoder = OutputEncoder(), OutputDecoder()
    touched: dict = {}
    decoder.apply(encoder.encode([_output("gone", [1, 2], "ab"), _output("kept", [3], "c")]),
                  touched, live={"kept"})
    assert list(touched) == ["kept"] and list(decoder._states) == ["kept"]
