"""The client's shortcut: detection on the chunks that can carry stats equals detection on all."""

from __future__ import annotations

import inspect

import payloads
import pytest

from speclens.bench.adapters import detect
from speclens.bench.client import carriers

FIXTURES = [
    fn for name, fn in inspect.getmembers(payloads, inspect.isfunction)
    if not name.startswith("_") and fn.__module__ == payloads.__name__
]  # fmt: skip


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.__name__)
def test_carriers_keep_every_detection_result(fixture) -> None:
    try:
        responses = fixture()
    except TypeError:  # a helper that takes arguments
        pytest.skip("not a payload fixture")
    full, short = detect(responses), detect(carriers(responses))
    assert (short.status, short.adapter, short.record) == (full.status, full.adapter, full.record)


def test_plain_content_chunks_are_skipped() -> None:
    plain = {
        "id": "x",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "a", "finish_reason": None}],
    }
    final = {
        "id": "x",
        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
        "usage": {"completion_tokens": 3},
    }
    assert carriers([plain, plain, final]) == [final]
