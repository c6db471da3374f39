"""What a run read back says of itself (``runs.rundir.Run``): its completed rows, the K it ran,
whether its acceptance was forced and at which AL, its engine; and the bounds every integer and
number it reads must meet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speclens.runs import rundir
from speclens.runs.record import MAX_COUNT


def _run(rows: list[dict[str, Any]] | None = None, **summary: Any) -> rundir.Run:
    summary.setdefault("settings", {})
    return rundir.Run(Path("r"), summary, rows or [])


def _spec(k: int) -> dict[str, Any]:
    return {"success": True, "spec_decode_acceptance": {"num_spec_tokens": k}}


def test_completed_rows_are_the_successes_without_a_row_error() -> None:
    rows = [{"success": True, "i": 0}, {"success": False, "i": 1},
            {"success": True, "row_error": "x", "i": 2}, {"i": 3}]  # fmt: skip
    assert [r["i"] for r in _run(rows).completed] == [0]


def test_the_k_is_the_requests_then_the_servers_then_the_settings() -> None:
    server = {"acceptance": {"num_speculative_tokens": 5}}
    settings = {"num_speculative_tokens": 6}
    assert _run([_spec(3), _spec(4)], server=server, settings=settings).ks() == {3, 4}
    assert _run([{**_spec(3), "success": False}], server=server, settings=settings).ks() == {5}
    assert _run(server={"acceptance": {}}, settings=settings).ks() == {6}
    assert _run(settings={"num_speculative_tokens": 0}).ks() == set()
    assert _run(server={"acceptance": {"num_speculative_tokens": True}}).ks() == set()


@pytest.mark.parametrize(
    ("summary", "forced", "al"),
    [
        ({"server": {"acceptance": {"forced": True, "acceptance_length": 3.5}}}, True, 3.5),
        ({"server": {"acceptance": {"forced": True, "acceptance_length": "3.5"}}}, True, None),
        ({"server": {"acceptance": {"forced": 1, "acceptance_length": 3.5}}}, False, None),
        ({"server": {"acceptance": {"forced": False, "acceptance_length": 3.5}}}, False, None),
        ({"server": {"acceptance": None}, "verdict": {"expected": 3.0}}, True, None),
        ({"server": "vllm", "verdict": "pass"}, False, None),
        ({}, False, None),
    ],
)
def test_forced_and_its_al(summary: dict[str, Any], forced: bool, al: float | None) -> None:
    run = _run(**summary)
    assert run.forced is forced
    assert run.forced_al == al


def test_the_engine_is_a_name_or_none() -> None:
    assert _run(server={"engine": "vllm"}).engine == "vllm"
    assert _run(server={"engine": 3}).engine is None
    assert _run(server=None).engine is None


@pytest.mark.parametrize(
    ("value", "int_ok", "number_ok"),
    [
        (0, True, True),
        (MAX_COUNT, True, True),
        (MAX_COUNT + 1, False, True),
        (-1, False, True),
        (True, False, False),
        (2.0, False, True),
        (float("nan"), False, False),
        (float("inf"), False, False),
        ("3", False, False),
    ],
)
def test_integers_and_numbers_read(value: object, int_ok: bool, number_ok: bool) -> None:
    assert rundir.is_int(value) is int_ok
    assert rundir.is_number(value) is number_ok
