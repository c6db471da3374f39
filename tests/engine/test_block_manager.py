"""``BlockManager`` keeps a request's blocks consecutive while there is room (attention then reads
its context in place), hands out every block when there is not, and is deterministic."""

from __future__ import annotations

from speclens.engine.kv_cache import BlockManager
from speclens.engine.request import Request, SamplingParams


def _request(name: str) -> Request:
    return Request(name, [1], SamplingParams())


def _consecutive(table: list[int]) -> bool:
    return table == list(range(table[0], table[0] + len(table)))


def test_requests_admitted_together_each_grow_in_place() -> None:
    blocks = BlockManager(256, 16)
    requests = [_request(str(i)) for i in range(8)]
    for i, r in enumerate(requests):  # prompts of 1 to 8 blocks, admitted one after another
        blocks.reserve(r, 16 * (i + 1))
    for step in range(1, 65):  # then every request grows by a token per step, in turn
        for i, r in enumerate(requests):
            blocks.reserve(r, 16 * (i + 1) + step)
    assert all(_consecutive(r.block_table) for r in requests)
    assert blocks.num_free == 256 - sum(len(r.block_table) for r in requests)
    used = [b for r in requests for b in r.block_table]
    assert len(set(used)) == len(used)


def test_a_full_pool_hands_out_every_block_once() -> None:
    blocks = BlockManager(10, 4)
    a, b, c = _request("a"), _request("b"), _request("c")
    blocks.reserve(a, 12)
    blocks.reserve(b, 8)
    blocks.reserve(c, 4)
    blocks.free(b)
    blocks.reserve(a, 40 - 4)  # a takes everything left, wherever it is
    assert blocks.num_free == 0
    assert sorted(a.block_table + c.block_table) == list(range(10))
    try:
        blocks.reserve(c, 8)
    except RuntimeError as exc:
        assert "exhausted" in str(exc)
    else:
        raise AssertionError("an exhausted pool handed out a block")
    blocks.free(a)
    blocks.free(c)
    assert blocks.num_free == 10 and blocks.usage == 0.0


def test_the_same_calls_give_the_same_blocks() -> None:
    def run() -> list[list[int]]:
        blocks = BlockManager(64, 16)
        requests = [_request(str(i)) for i in range(5)]
        for i, r in enumerate(requests):
            blocks.reserve(r, 40 * (i + 1))
        blocks.free(requests[2])
        for r in requests[:2] + requests[3:]:
            blocks.reserve(r, 40 * 6)
        return [r.block_table for r in requests]

    assert run() == run()
