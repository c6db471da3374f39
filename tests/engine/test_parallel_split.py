"""``parallel_shard.split``: the balanced contiguous ranges ranks shard heads and MLP columns by,
checked on uneven splits against ranges written out by hand, and ``shard_model``'s uneven shards
put back together give the whole model's weights."""

from __future__ import annotations

import itertools

import pytest
import torch

from speclens.engine.model import DecoderLayer, LlamaModel, ModelConfig
from speclens.engine.parallel_comm import Comm
from speclens.engine.parallel_shard import shard_model, split


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [
        (10, 3, [(0, 4), (4, 7), (7, 10)]),
        (3, 2, [(0, 2), (2, 3)]),  # SmolLM2's 3 KV groups at TP 2: rank 0 holds 2, rank 1 one
        (11, 4, [(0, 3), (3, 6), (6, 9), (9, 11)]),
        (7, 7, [(i, i + 1) for i in range(7)]),
        (8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        (5, 1, [(0, 5)]),
        (2, 3, [(0, 1), (1, 2), (2, 2)]),
    ],
)
def test_split_by_hand(total: int, parts: int, expected: list[tuple[int, int]]) -> None:
    assert [split(total, parts, i) for i in range(parts)] == expected


@pytest.mark.parametrize("parts", range(1, 9))
def test_split_is_contiguous_covering_and_balanced(parts: int) -> None:
    """For every total: rank i's range starts where rank i-1's ends, the first starts at 0 and
    the last ends at the total, sizes differ by at most one and the larger ones come first."""
    for total in range(0, 50):
        ranges = [split(total, parts, i) for i in range(parts)]
        assert ranges[0][0] == 0 and ranges[-1][1] == total, (total, ranges)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges
        sizes = [stop - start for start, stop in ranges]
        assert sum(sizes) == total
        assert max(sizes) - min(sizes) <= 1, (total, sizes)
        assert sizes == sorted(sizes, reverse=True), (total, sizes)
        assert sizes.count(total // parts + 1) == total % parts, (total, sizes)


def test_uneven_shards_put_back_together_are_the_whole_model() -> None:
    """3 KV groups over 2 ranks (2 and 1) and 10 MLP columns over 3 ranks (4, 3 and 3): each
    rank's rows (or columns, row-parallel), in rank order, are the unsharded model's."""
    config = ModelConfig(
        vocab_size=32, hidden_size=24, intermediate_size=10, num_hidden_layers=1,
        num_attention_heads=6, num_key_value_heads=3, head_dim=4,
    )  # fmt: skip
    torch.manual_seed(0)
    whole = LlamaModel(config)
    state = {k: v.clone() for k, v in whole.state_dict().items()}
    for size in (2, 3):
        shards = []
        for rank in range(size):
            model = LlamaModel(config)
            model.load_state_dict(state)
            shard_model(model, rank, size, Comm(rank, size))
            layer = model.model.layers[0]
            assert isinstance(layer, DecoderLayer)
            shards.append(layer)
        heads = [layer.self_attn.num_kv_heads for layer in shards]
        assert heads == [2, 1] if size == 2 else heads == [1, 1, 1]
        cols = [layer.mlp.gate_proj.weight.shape[0] for layer in shards]
        assert cols == ([5, 5] if size == 2 else [4, 3, 3])
        for name, dim in [
            ("self_attn.q_proj", 0), ("self_attn.k_proj", 0), ("self_attn.v_proj", 0),
            ("self_attn.o_proj", 1), ("mlp.gate_proj", 0), ("mlp.up_proj", 0),
            ("mlp.down_proj", 1),
        ]:  # fmt: skip
            parts = [layer.get_submodule(name).weight for layer in shards]
            joined = torch.cat(parts, dim=dim)
            assert torch.equal(joined, state[f"model.layers.0.{name}.weight"]), (size, name)
