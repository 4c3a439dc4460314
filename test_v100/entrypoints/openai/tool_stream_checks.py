"""Shared checks of the argument-by-argument tool-call streams (qwen3_coder, gemma4): an output
fed in random pieces adds up, as a client adds deltas up, to the parser's whole-output result."""

from __future__ import annotations

import json
import random


def random_cuts(text: str, seed: int) -> list[int]:
    rng = random.Random(seed)
    count = min(len(text) - 1, rng.randint(1, 40))
    return sorted(rng.sample(range(1, len(text)), count)) + [len(text)] if len(text) > 1 else [len(text)]


def stream_pieces(parser, text: str, cuts: list[int]) -> tuple[str, list[dict]]:
    """(content, calls) a client gets from feeding `text` cut at `cuts`; checks the delta
    contract on the way: the first delta of a call has its id, type and name, later ones only
    argument text, and each delta's index is the stream's num_calls before the feed plus its
    position (how the chat handler numbers them)."""
    stream, content, calls = parser.streamer(), "", []
    for cut in cuts:
        first = stream.num_calls
        delta, deltas = stream.feed(text[:cut], final=cut == len(text))
        content += delta
        for k, d in enumerate(deltas):
            item = d.to_dict()
            assert item["index"] == first + k
            if item["index"] == len(calls):
                assert item["type"] == "function" and item["id"].startswith("chatcmpl-tool-")
                calls.append({"id": item["id"], "name": item["function"]["name"], "arguments": ""})
            else:
                assert set(item) == {"index", "function"} and set(item["function"]) == {"arguments"}
            calls[item["index"]]["arguments"] += item["function"]["arguments"]
    assert stream.num_calls == len(calls)
    return content, calls


def check_stream_matches_whole(parser, text: str, seed: int) -> None:
    want_content, want_calls = parser.extract(text)
    content, calls = stream_pieces(parser, text, random_cuts(text, seed))
    assert content == (want_content or "")
    # The argument texts add up to exactly the non-streamed arguments, valid JSON.
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in want_calls]
    for call in calls:
        assert isinstance(json.loads(call["arguments"]), dict)
