"""Aggregate-only summaries that lie: a NaN or negative TPOT, no figures block, a concurrency
given as text. compare (and the sweep's reading of a point) says so in one line naming the file
and the field, exit 1, never a traceback. A records.jsonl beside an aggregate-only summary is
not read (the summary is the run), and compare says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aggregatekit import summary, write_point, write_sweep
from speclens.runs.points import PointError, summarize


def _one_line(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 1, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err + out
    for needle in needles:
        assert needle in lines[0], lines[0]


def _nan(data: dict[str, Any]) -> None:
    data["figures"]["latency_ms"]["tpot"]["p50"] = float("nan")


CASES = {
    "NaN TPOT": (_nan, "figures.latency_ms.tpot.p50: expected null or milliseconds >= 0, got nan"),
    "negative TPOT": (lambda d: d["figures"]["latency_ms"]["tpot"].update(p50=-3.0),
                      "figures.latency_ms.tpot.p50: expected null or milliseconds >= 0, got -3.0"),
    "infinite throughput": (
        lambda d: d["figures"]["throughput"].update(total_tokens_per_s_per_gpu=float("inf")),
        "figures.throughput.total_tokens_per_s_per_gpu: expected null or tokens/s >= 0"),
    "no figures": (lambda d: d.pop("figures"),
                   "figures: expected the published figures (an object), got nothing"),
    "string concurrency": (lambda d: d["settings"].update(concurrency="4"),
                           "settings.concurrency: expected null or an integer > 0, got '4'"),
    "negative interactivity": (lambda d: d["figures"]["interactivity"].update(p50=-1),
                               "figures.interactivity.p50: expected null or tokens/s per user"),
}  # fmt: skip


def _bad(path: Path, name: str) -> Path:
    data = summary()
    CASES[name][0](data)
    # Python's json writes NaN and Infinity, as a hand-made or third-party file may hold them
    return write_point(path, data, raw=json.dumps(data).encode())


@pytest.mark.parametrize("name", list(CASES))
def test_compare_names_the_file_and_the_field(run_cli, tmp_path: Path, name: str) -> None:
    good = write_point(tmp_path / "good", summary())
    bad = _bad(tmp_path / "bad", name)
    _one_line(*run_cli("compare", good, bad), f"{bad / 'summary.json'}: {CASES[name][1]}")


@pytest.mark.parametrize("name", ["NaN TPOT", "negative TPOT", "no figures"])
def test_a_sweep_point_names_the_file_and_the_field(tmp_path: Path, name: str) -> None:
    bad = _bad(tmp_path / "bad", name)
    with pytest.raises(PointError, match=CASES[name][1].replace("(", r"\(").replace(")", r"\)")):
        summarize(bad)


def test_a_bad_point_of_an_aggregate_sweep(run_cli, tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "s", [summary(concurrency=c) for c in (4, 8)])
    _bad(sweep / "points" / "c8", "negative TPOT")
    good = write_sweep(tmp_path / "g", [summary(concurrency=c) for c in (4, 8)])
    _one_line(*run_cli("compare", good, sweep), "c8/summary.json: figures.latency_ms.tpot.p50")


def test_nan_in_a_summary_that_is_not_aggregate_only_is_still_not_json(
    run_cli, tmp_path: Path
) -> None:
    data = summary()
    del data["aggregate_only"]
    _nan(data)
    bad = write_point(tmp_path / "bad", data, raw=json.dumps(data).encode())
    (bad / "records.jsonl").write_bytes(b"")
    good = write_point(tmp_path / "good", summary())
    _one_line(*run_cli("compare", good, bad), "summary.json: not JSON")


def test_records_beside_an_aggregate_summary_are_not_read_and_it_says_so(
    run_cli, tmp_path: Path
) -> None:
    a = write_point(tmp_path / "a", summary(tpot_p50=10.0))
    b = write_point(tmp_path / "b", summary(tpot_p50=5.0, method="mtp", k=3))
    (b / "records.jsonl").write_bytes(b"{not json at all\n" * 3)
    code, out, err = run_cli("compare", a, b)
    assert code == 0, err
    assert "Traceback" not in out + err
    assert f"note: {b / 'records.jsonl'}: not read: summary.json says aggregate-only" in out
    assert "comparable as a speculation A/B" in out
