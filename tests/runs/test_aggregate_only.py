"""Aggregate-only runs (published figures, no records.jsonl) are read, not refused: by the run
reader, by a sweep point's figures, by report.html and the sweep report, and by compare, whose
checks that need per-request data say so and neither pass nor fail."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import orjson
import pytest

from aggregatekit import summary, write_point, write_sweep
from comparekit import write_run
from reportkit import external_references, field_mismatches, scan
from speclens.runs import compare as cmp
from speclens.runs import rundir
from speclens.runs.compare_inputs import kind_of, labels_for, read_inputs, read_run
from speclens.runs.html_aggregate import AGGREGATE_LINE
from speclens.runs.html_run import write_run_report
from speclens.runs.html_sweep import write_sweep_report
from speclens.runs.points import summarize

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")


def _compare(*paths: Path) -> dict:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [None] * len(paths))
    return cmp.compare(inputs)


def test_read_run_takes_the_summary_and_no_rows(tmp_path: Path) -> None:
    run = read_run(write_point(tmp_path / "a", summary(tpot_p50=12.5)))
    assert run.rows == [] and run.aggregate_only and run.notes == []
    assert run.summary["figures"]["latency_ms"]["tpot"]["p50"] == 12.5
    assert run.settings["hardware"] == "mi355x"


def test_a_run_without_the_marker_and_without_records_is_still_refused(tmp_path: Path) -> None:
    data = summary()
    del data["aggregate_only"]
    path = write_point(tmp_path / "a", data)
    with pytest.raises(rundir.InputError) as caught:
        kind_of(path)
    assert caught.value.code == 2 and "records.jsonl missing" in caught.value.lines[0]
    with pytest.raises(rundir.InputError):  # the reader alone refuses it too
        rundir.read_run(path, rundir.fields(()), rundir.fields(("settings",)))


def test_a_point_of_published_figures_has_them_without_intervals(tmp_path: Path) -> None:
    data = summary(tpot_p50=10.0, ttft_p50=80.0, total_per_gpu=1200.0, interactivity=97.0)
    figures = summarize(write_point(tmp_path / "a", data)).figures
    assert figures is not None
    published = data["figures"]
    assert figures["tpot_ms"].mean == published["latency_ms"]["tpot"]["mean"]
    assert figures["ttft_ms"].mean == published["latency_ms"]["ttft"]["mean"]
    assert figures["e2e_ms"].mean == published["latency_ms"]["e2e"]["mean"]
    assert figures["output_tokens_per_s"].mean == published["throughput"]["output_tokens_per_s"]
    assert figures["tokens_per_s_per_user"].mean == published["interactivity"]["mean"]
    assert all(iv.method == "none" and math.isnan(iv.low) for iv in figures.values())
    assert math.isnan(figures["realized_al"].mean)  # nothing published


def test_a_point_that_published_medians_only_shows_them(tmp_path: Path) -> None:
    """Most of InferenceX's earlier points publish median and p99 latencies, no mean: the
    point's figures take the median rather than show nothing."""
    data = summary(tpot_p50=11.0, ttft_p50=90.0)
    for name in ("ttft", "tpot", "itl", "e2e"):
        del data["figures"]["latency_ms"][name]["mean"]
    figures = summarize(write_point(tmp_path / "a", data)).figures
    assert figures is not None
    assert figures["tpot_ms"].mean == 11.0 and figures["ttft_ms"].mean == 90.0


def _page_agrees(page: str, data: object) -> None:
    parsed = scan(page)
    assert len(parsed.fields) > 10
    assert field_mismatches(parsed.fields, data) == []


def test_report_of_an_aggregate_run(tmp_path: Path) -> None:
    data = summary(method="mtp", k=3, tpot_p50=7.25)
    path = write_point(tmp_path / "a", data)
    page = write_run_report(path).read_text()
    _page_agrees(page, data)
    for text in ("mi355x", "sglang", "lmsysorg/sglang:v0.5.12", "fp8", "mtp", "2026-05-21",
                 AGGREGATE_LINE, "TPOT", "total throughput per GPU"):  # fmt: skip
        assert text in page, text
    fields = {p for p, _ in scan(page).fields}
    for field in ("figures.latency_ms.tpot.p50", "figures.latency_ms.ttft.p99",
                  "figures.latency_ms.e2e.mean", "figures.interactivity.p50",
                  "figures.throughput.total_tokens_per_s_per_gpu",
                  "figures.throughput.total_tokens_per_s", "settings.tensor_parallel",
                  "settings.gpus", "settings.concurrency", "settings.num_spec_tokens",
                  "settings.input_tokens.min"):  # fmt: skip
        assert field in fields, field
    # the run's URL is a plain link, the only reference out of the page; no plot needs rows
    assert external_references(page) == [f"a href={data['provenance']['run_url']!r}"]
    assert "<svg" not in page


def test_a_url_that_is_not_http_is_text_not_a_link(tmp_path: Path) -> None:
    data = summary()
    data["provenance"]["run_url"] = "javascript:alert(1)"
    page = write_run_report(write_point(tmp_path / "a", data)).read_text()
    assert external_references(page) == [] and "javascript:alert(1)" in page


def test_sweep_report_of_aggregate_points(tmp_path: Path) -> None:
    points = [summary(concurrency=c, tpot_p50=5.0 * c**0.5) for c in (4, 8, 16)]
    sweep = write_sweep(tmp_path / "s", points)
    page = write_sweep_report(sweep).read_text()
    data = orjson.loads((sweep / "sweep.json").read_bytes())
    _page_agrees(page, data)
    assert "3 of 3 points are aggregate-only" in page and "n/a: aggregate-only" in page
    fields = {p for p, _ in scan(page).fields}
    for i in range(3):
        assert f"stats[{i}].figures.tpot_ms.mean" in fields
        assert f"stats[{i}].figures.tpot_ms.low" not in fields  # no interval shown


def test_compare_of_published_figures_only_says_which_checks_did_not_run(tmp_path: Path) -> None:
    a = write_point(tmp_path / "a", summary(tpot_p50=10.0, date="2026-05-21"))
    b = write_point(tmp_path / "b", summary(tpot_p50=12.0, date="2026-05-27"))
    pair = _compare(a, b)["pairs"][0]
    checks = {c["name"]: c for c in pair["checks"]}
    for name in ("prompts", "sampling", "acceptance", "histogram"):
        assert checks[name]["ok"] is None
        assert checks[name]["detail"] == "needs per-request data: A and B are aggregate-only"
    assert pair["verdict"] == "published figures only" and pair["comparable"] is False
    assert not pair["label"].startswith("comparable")
    tpot = [r for r in pair["deltas"]["matched_concurrency"] if r["figure"] == "tpot_p50_ms"]
    assert tpot[0]["ratio"] == pytest.approx(1.2) and tpot[0]["ratio_low"] is None
    assert tpot[0]["interval"] == "no interval: aggregate-only"


def test_cli_prints_not_run_checks_and_exits_1_when_unchecked(run_cli, tmp_path: Path) -> None:
    a = write_point(tmp_path / "a", summary(tpot_p50=10.0))
    b = write_point(tmp_path / "b", summary(tpot_p50=12.0, date="2026-05-27"))
    code, out, err = run_cli("compare", a, b, *AB)
    assert code == 1, err
    assert "published figures only" in out
    assert "n/a  prompts: needs per-request data: A and B are aggregate-only" in out
    assert "UNCHECKED: concurrency 4: tpot_p50_ms B/A 1.20x (no interval: aggregate-only)" in out


def test_a_measured_run_against_a_published_point(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", model="deepseek-r1")
    b = write_point(tmp_path / "b", summary())
    pair = _compare(a, b)["pairs"][0]
    checks = {c["name"]: c for c in pair["checks"]}
    assert checks["prompts"]["detail"] == "needs per-request data: B is aggregate-only"
    assert checks["histogram"]["ok"] is None and checks["deployment"]["ok"] is None
    assert pair["verdict"] == "published figures only"


def test_runs_of_different_chips_or_lengths_are_not_comparable(tmp_path: Path) -> None:
    a = write_point(tmp_path / "a", summary())
    b = write_point(tmp_path / "b", summary(hardware="h200"))
    c = write_point(tmp_path / "c", summary(isl=8192))
    first = _compare(a, b)["pairs"][0]
    assert first["verdict"] == "not comparable" and "hardware mi355x vs h200" in first["label"]
    second = _compare(a, c)["pairs"][0]
    assert second["verdict"] == "not comparable"
    assert "published input / output tokens 1024 / 1024 vs 8192 / 1024" in second["label"]


def test_the_sweep_files_hold_one_row_per_published_point(tmp_path: Path) -> None:
    points = [summary(concurrency=c, tpot_p50=5.0 * c**0.5) for c in (4, 8, 16)]
    sweep = write_sweep(tmp_path / "s", points)
    data = orjson.loads((sweep / "sweep.json").read_bytes())
    assert [p["status"] for p in data["points"]] == ["ok"] * 3
    for stats, point in zip(data["stats"], points, strict=True):
        tpot = stats["figures"]["tpot_ms"]
        assert tpot["mean"] == point["figures"]["latency_ms"]["tpot"]["mean"]
        assert (tpot["low"], tpot["high"], tpot["method"]) == (None, None, "none")
    rows = list(csv.DictReader(io.StringIO((sweep / "sweep.csv").read_text())))
    assert [r["id"] for r in rows] == ["c4", "c8", "c16"]
    assert float(rows[1]["tpot_ms_mean"]) == points[1]["figures"]["latency_ms"]["tpot"]["mean"]
    assert rows[1]["tpot_ms_low"] == rows[1]["tpot_ms_high"] == ""
