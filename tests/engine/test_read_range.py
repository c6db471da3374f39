"""A batch of one request whose context sits in consecutive cache slots attends over the pool's
slice in place (``ForwardBatch.read_range``); the result must be bit for bit the gathered one."""

from __future__ import annotations

import dataclasses

import torch

from speclens.engine.batch import build_batch
from speclens.engine.model import KVPool
from speclens.engine.weights import load_model


def test_in_place_slice_equals_gather() -> None:
    model, _ = load_model("dummy", seed=0)
    kv = KVPool(model.config, model.num_layers, 8, 16, torch.float32, torch.device("cpu"))
    prompt = list(range(40, 90))
    with torch.inference_mode():
        prefill = build_batch([[2, 3, 4, 5]], [0], [prompt], 16, kv.scratch_slot, kv.k.device)
        assert prefill.read_range == (32, 32 + len(prompt))
        model(prefill, kv)
        step = build_batch([[2, 3, 4, 5]], [50], [[7, 8, 9]], 16, kv.scratch_slot, kv.k.device)
        assert step.read_range == (32, 85)
        gathered = dataclasses.replace(step, read_range=None)
        assert torch.equal(model(step, kv), model(gathered, kv))
    # blocks out of order, or two requests: gathered
    assert build_batch([[3, 2]], [0], [[1] * 20], 16, 128, kv.k.device).read_range is None
    two = build_batch([[0], [1]], [0, 0], [[1, 2], [3, 4]], 16, 128, kv.k.device)
    assert two.read_range is None


def test_per_request_attention_equals_the_padded_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Contexts of 70, 5 and 33 tokens, one request's blocks out of order (a gathered context),
    the others in order (read in place), query widths 3, 1 and 5: attending request by request
    gives the padded forward's hidden states at every real row, to float32 rounding."""
    import speclens.engine.batch as batch_module

    model, _ = load_model("dummy", seed=0)
    kv = KVPool(model.config, model.num_layers, 16, 16, torch.float32, torch.device("cpu"))
    tables = [[0, 1, 2, 3, 4], [6], [9, 7, 8]]
    prompts = [list(range(10, 77)), list(range(5, 9)), list(range(100, 128))]
    with torch.inference_mode():
        for table, prompt in zip(tables, prompts, strict=True):
            model(build_batch([table], [0], [prompt], 16, kv.scratch_slot, kv.k.device), kv)
        starts = [len(p) for p in prompts]
        step = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
        fast = build_batch(tables, starts, step, 16, kv.scratch_slot, kv.k.device)
        assert fast.segments is not None and fast.mask is None
        assert [isinstance(s.keys, tuple) for s in fast.segments] == [True, True, False]
        got = model(fast, kv)
        monkeypatch.setattr(batch_module, "MAX_ATTENTION_PADDING", float("inf"))
        padded = build_batch(tables, starts, step, 16, kv.scratch_slot, kv.k.device)
        assert padded.segments is None and padded.mask is not None
        want = model(padded, kv)
    for b, toks in enumerate(step):
        torch.testing.assert_close(got[b, : len(toks)], want[b, : len(toks)])
    assert got.abs().sum() > 0


def test_a_verify_step_where_one_request_drafted_attends_request_by_request() -> None:
    """8 requests at equal contexts, one verifying 4 drafts: padding all 8 to 5 query rows
    would attend 40 rows for 12 real ones, so each request attends on its own; with all 8
    verifying 4, the padded layout is the real one and is kept."""
    tables, starts = [[b] for b in range(8)], [10] * 8
    one = build_batch(tables, starts, [[1, 2, 3, 4, 5]] + [[1]] * 7, 16, 128, torch.device("cpu"))
    assert one.segments is not None and one.mask is None
    assert [s.rows for s in one.segments] == [(0, 5), *((5 + i, 6 + i) for i in range(7))]
    every = build_batch(tables, starts, [[1, 2, 3, 4, 5]] * 8, 16, 128, torch.device("cpu"))
    assert every.segments is None and every.mask is not None
