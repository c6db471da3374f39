"""The client's shortcut: detection on the chunks that can carry stats equals detection on all."""

from __future__ import annotations

import inspect

import payloads
import pytest

from speclens.bench.adapters import detect
from speclens.bench.client import carriers

#: Every public function of ``payloads`` is a payload fixture: it takes no argument and returns
#: a fresh responses list (a helper that needs arguments must be private, ``_name``).
FIXTURES = [
    fn for name, fn in inspect.getmembers(payloads, inspect.isfunction)
    if not name.startswith("_") and fn.__module__ == payloads.__name__
]  # fmt: skip


def test_every_public_payload_helper_is_a_fixture() -> None:
    """Nothing is left out silently: every public helper is called by the test below with no
    arguments, and every valid payload the adapter tests use is among them."""
    assert len(FIXTURES) >= len(payloads.VALID)
    assert [f.__name__ for f in FIXTURES if inspect.signature(f).parameters] == []
    assert {fn for fn, *_ in payloads.VALID.values()} <= set(FIXTURES)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.__name__)
def test_carriers_keep_every_detection_result(fixture) -> None:
    responses = fixture()
    assert isinstance(responses, list) and responses, fixture.__name__
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
