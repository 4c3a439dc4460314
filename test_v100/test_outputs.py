"""Output dataclasses: vLLM's fields, finished(), reprs."""

from __future__ import annotations

from vllm_volta.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput


def _completion(**kw) -> CompletionOutput:
    base = dict(index=0, text=" Paris.", token_ids=[3, 4], cumulative_logprob=-1.5,
                logprobs=[{3: Logprob(-0.5, 1, " Paris")}, {4: Logprob(-1.0, 2, ".")}])
    base.update(kw)
    return CompletionOutput(**base)


def test_logprob_defaults() -> None:
    lp = Logprob(-0.25)
    assert (lp.logprob, lp.rank, lp.decoded_token) == (-0.25, None, None)


def test_completion_finished() -> None:
    assert not _completion().finished()
    done = _completion(finish_reason="stop", stop_reason="\n")
    assert done.finished() and done.stop_reason == "\n"


def test_completion_repr_matches_vllm_layout() -> None:
    r = repr(_completion(finish_reason="length"))
    assert r.startswith("CompletionOutput(index=0, text=' Paris.', token_ids=[3, 4], "
                        "cumulative_logprob=-1.5, logprobs=[{3: Logprob(logprob=-0.5, rank=1")
    assert r.endswith("finish_reason=length, stop_reason=None)")


def test_request_output_fields_and_repr() -> None:
    metrics = RequestMetrics(arrival_time=10.0, first_scheduled_time=10.5)
    out = RequestOutput(request_id="0", prompt="The capital", prompt_token_ids=[1, 2],
                        prompt_logprobs=[None, {2: Logprob(-3.0, 7)}],
                        outputs=[_completion()], finished=False, metrics=metrics)
    assert out.error is None and out.num_cached_tokens is None
    assert metrics.time_in_queue == 0.5 and RequestMetrics(1.0).time_in_queue is None
    r = repr(out)
    assert r.startswith("RequestOutput(request_id=0, prompt='The capital', "
                        "prompt_token_ids=[1, 2], prompt_logprobs=[None, {2: Logprob(")
    assert "outputs=[CompletionOutput(index=0" in r and "finished=False" in r


def test_failed_request_output_carries_error() -> None:
    out = RequestOutput("r1", "x" * 10, [1] * 10, None, [], finished=True,
                        error="prompt_token_ids: prompt has 10 tokens, max_model_len is 8")
    assert out.finished and "max_model_len" in out.error and "error='prompt_token_ids" in repr(out)
