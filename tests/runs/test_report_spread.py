"""The console report and report.html show the per-request AL distribution: p10, p50 and p90,
the run's and each category's, and the split of the per-step variance within and between
requests; the page plots the histogram over requests. Every number on the page is the
summary's, at its own data-field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from matplotlib.figure import Figure
from rich.console import Console

from reportkit import field_mismatches, scan
from speclens.runs import html_plots as hp
from speclens.runs.figures import summarize
from speclens.runs.html_plots import CI_TITLE
from speclens.runs.html_run import run_page, samples_from_records, write_run_report
from speclens.runs.report import print_summary
from speclens.runs.request import RequestRecord, RunResult
from spreadkit import natural_requests, record, spec


def _summary(records: list[RequestRecord]) -> dict[str, Any]:
    return {"settings": {"model": "dummy"}, "figures": summarize(RunResult(records, 0.0, 2.0))}


@pytest.fixture(scope="module")
def run() -> tuple[list[RequestRecord], dict[str, Any]]:
    records = natural_requests({"coding": 24, "math": 21}, seed=11)
    return records, _summary(records)


def _console(summary: dict[str, Any]) -> str:
    """The report as text, each run of spaces (a table's padding) one space."""
    console = Console(record=True, width=400)
    print_summary(console, summary)
    return re.sub(" +", " ", console.export_text())


def test_the_console_shows_the_quantiles_and_the_split(
    run: tuple[list[RequestRecord], dict[str, Any]],
) -> None:
    text = _console(run[1])
    acc = run[1]["figures"]["acceptance"]
    block, v = acc["per_request"], acc["per_request"]["variance"]
    q = block["quantiles"]
    assert (f"per-request AL (step-weighted) │ p10 {q['p10']:.4f}, p50 {q['p50']:.4f}, "
            f"p90 {q['p90']:.4f} over 45 requests, each weighted by its verify steps") in text  # fmt: skip
    assert (f"within {v['within']:.4f}, between {v['between']:.4f} (observed "
            f"{v['between_observed']:.4f} less sampling noise {v['noise']:.4f}): "
            f"{v['between_share']:.1%} of the per-step variance {v['total']:.4f}") in text  # fmt: skip
    for category in ("coding", "math"):
        c = acc["al_by_category"][category]["per_request"]
        assert (f"per-request AL ({category}) │ p10 {c['quantiles']['p10']:.4f}, p50 "
                f"{c['quantiles']['p50']:.4f}") in text  # fmt: skip
        assert f"between {c['variance']['between']:.4f}" in text


def test_the_console_says_why_the_split_is_unknown() -> None:
    records = natural_requests({"c": 20}, seed=2)
    records.append(record(20, "c", spec(None, 3, steps=10, accepted=12)))
    text = _console(_summary(records))
    assert ("within unknown: 1 of 21 requests report no acceptance histogram; between at most "
            in text)  # fmt: skip


def test_a_summary_from_before_the_spread_still_prints(
    run: tuple[list[RequestRecord], dict[str, Any]],
) -> None:
    acc = {key: value for key, value in run[1]["figures"]["acceptance"].items()
           if key != "per_request"}  # fmt: skip
    acc["al_by_category"] = {c: {"al": row["al"], "verify_steps": row["verify_steps"]}
                             for c, row in acc["al_by_category"].items()}  # fmt: skip
    text = _console({**run[1], "figures": {**run[1]["figures"], "acceptance": acc}})
    assert "per-request AL (step-weighted)" not in text and "AL (coding)" in text


def test_the_page_shows_every_number_at_its_field(
    run: tuple[list[RequestRecord], dict[str, Any]],
) -> None:
    records, summary = run
    page = run_page(summary, samples_from_records(records)).render()
    fields = scan(page).fields
    assert field_mismatches(fields, summary) == []
    paths = {path for path, _ in fields}
    for base in ("figures.acceptance.per_request",
                 "figures.acceptance.al_by_category.coding.per_request",
                 "figures.acceptance.al_by_category.math.per_request"):  # fmt: skip
        for leaf in ("requests", "verify_steps", "quantiles.p10", "quantiles.p50",
                     "quantiles.p90", "variance.within", "variance.between_observed",
                     "variance.noise", "variance.between", "variance.between_share"):  # fmt: skip
            assert f"{base}.{leaf}" in paths, f"{base}.{leaf}"
    assert (
        "<caption>AL between requests (each request weighted by its verify steps)</caption>" in page
    )
    assert 'aria-label="AL per request"' in page


def test_the_page_plots_the_histogram_over_requests(
    run: tuple[list[RequestRecord], dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Written from summary.json as bench writes it: the plot takes the histogram's bins, its
    title and axes name what it shows, and it claims no interval."""
    records, summary = run
    kept: list[Figure] = []
    original = hp.to_svg

    def keep(fig: Figure, name: str) -> str:
        kept.append(fig)
        return original(fig, name)

    monkeypatch.setattr(hp, "to_svg", keep)
    (tmp_path / "summary.json").write_bytes(orjson.dumps(summary))
    write_run_report(tmp_path, records)
    (fig,) = [f for f in kept if f.axes[0].get_title().startswith("AL per request")]
    ax = fig.axes[0]
    assert ax.get_title() == "AL per request (45 requests)"
    assert not ax.get_title().endswith(CI_TITLE)
    assert ax.get_xlabel() == "request AL (tokens per verify step)"
    assert ax.get_ylabel() == "share of verify steps"
    hist = summary["figures"]["acceptance"]["per_request"]["histogram"]
    heights = [bar.get_height() for bar in ax.containers[0]]
    assert heights == pytest.approx(hist["step_share"])
    assert ax.get_xlim() == pytest.approx((1.0, 4.0))


def test_a_malformed_histogram_is_not_drawn(
    run: tuple[list[RequestRecord], dict[str, Any]],
) -> None:
    records, summary = run
    bad = orjson.loads(orjson.dumps(summary))
    hist = bad["figures"]["acceptance"]["per_request"]["histogram"]
    hist["edges"] = hist["edges"][::-1]  # as many edges as bins need, falling
    page = run_page(bad, samples_from_records(records)).render()
    assert 'aria-label="AL per request"' not in page
    assert "AL between requests" in page  # the table still reads from the block
