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
