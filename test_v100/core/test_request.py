from __future__ import annotations

import vllm_volta.core.request as request_module
from vllm_volta.core.block_hash import hash_block_tokens


def test_block_hashes_are_computed_when_asked_for(make_request, monkeypatch):
    calls = []
    real = request_module.hash_blocks

    def counting(parent, token_ids, block_size):
        calls.append(len(token_ids))
        return real(parent, token_ids, block_size)

    monkeypatch.setattr(request_module, "hash_blocks", counting)
    req = make_request(range(10), block_size=4)
    req.append_output_token_ids([10, 11, 12])
    assert calls == []  # adding a request and appending tokens hash nothing
    h0 = hash_block_tokens(None, [0, 1, 2, 3])
    h1 = hash_block_tokens(h0, [4, 5, 6, 7])
    assert req.block_hashes == [h0, h1, hash_block_tokens(h1, [8, 9, 10, 11])]
    assert calls == [12]  # the three full blocks, in one call
    assert req.block_hashes[0] == h0 and calls == [12]  # no new full block: nothing rehashed
    req.append_output_token_ids([13, 14, 15, 16, 17, 18, 19])
    assert len(req.block_hashes) == 5 and calls == [12, 8]  # only the two new blocks


def test_block_hashes_chain_like_eager_hashing(make_request):
    # Asking once at the end gives the same chain as asking after every token.
    eager = make_request(range(5), block_size=4)
    lazy = make_request(range(5), block_size=4)
    for t in range(5, 23):
        eager.append_output_token_ids([t])
        assert len(eager.block_hashes) == (t + 1) // 4
        lazy.append_output_token_ids([t])
    assert lazy.block_hashes == eager.block_hashes
