"""report.html without a browser: written by every bench run, self-contained, its numbers equal
to the JSON beside it, a failed verification at the top; sweeps and compares; a 100k-request
run renders in bounded time and size."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from reportkit import ReportDirs, external_references, field_mismatches, make_dirs, scan
from speclens.runs.html import field_path, resolve_field, samples_from_file, write_run_report
from speclens.runs.report import record_row
from speclens.runs.request import RequestRecord

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReportDirs]:
    yield make_dirs(tmp_path_factory.mktemp("reports"))


def _page(directory: Path) -> str:
    return (directory / "report.html").read_text(encoding="utf-8")


def _sources(dirs: ReportDirs) -> list[tuple[Path, str]]:
    return [
        (dirs.run_ok, "summary.json"), (dirs.run_fail, "summary.json"),
        (dirs.sweep, "sweep.json"), (dirs.compare, "compare.json"),
    ]  # fmt: skip


def test_every_bench_run_writes_report_html_beside_summary_json(dirs: ReportDirs) -> None:
    for run in (dirs.run_ok, dirs.run_fail):
        assert (run / "report.html").is_file()
        assert {"summary.json", "records.jsonl", "latency_cdf.png"} <= {
            p.name for p in run.iterdir()
        }
    for point in ("c1-r0", "c2-r0"):
        assert 'href="points/' + point + '/report.html"' in _page(dirs.sweep)
    assert "1 of 2 points did not finish ok: c2-r0 (failed)" in _page(dirs.sweep)


def test_pages_are_self_contained(dirs: ReportDirs) -> None:
    for directory, source in _sources(dirs):
        page = _page(directory)
        assert external_references(page) == [], directory
        assert "Content-Security-Policy" in page and "default-src 'none'" in page
        assert f'<meta name="speclens-source" content="{source}">' in page
        assert "<svg" in page, directory  # the plots are inline


def test_every_number_shown_equals_the_json_beside_it(dirs: ReportDirs) -> None:
    for directory, source in _sources(dirs):
        data = orjson.loads((directory / source).read_bytes())
        fields = scan(_page(directory)).fields
        assert len(fields) > 10, directory
        assert field_mismatches(fields, data) == [], directory


def test_the_run_page_shows_the_console_tables_figures(dirs: ReportDirs) -> None:
    paths = {path for path, _ in scan(_page(dirs.run_ok)).fields}
    for expected in (
        "figures.acceptance.token_weighted_al", "figures.acceptance.verify_steps",
        "figures.throughput.output_tokens_per_s", "figures.throughput.requests_per_s",
        "figures.latency_ms.ttft.p50", "figures.latency_ms.tpot.p99", "figures.latency_ms.e2e.max",
        "figures.acceptance.histogram.2", "figures.acceptance.al_by_category.random.al",
        "verdict.realized_acceptance_length", "verdict.expected_distribution.3",
    ):  # fmt: skip
        assert expected in paths
    page = _page(dirs.run_ok)
    for title in ("Latency CDFs", "Pooled acceptance histogram", "Per-position acceptance",
                  "AL per category", "AL against TPOT", "Derived per engine"):  # fmt: skip
        assert title in page or title.lower() in page.lower(), title


def test_a_failed_verification_says_so_at_the_top(dirs: ReportDirs) -> None:
    page = _page(dirs.run_fail)
    body = page[page.index("</h1>") :]
    assert body.index('class="banner fail"') < body.index("<table")
    assert "verification FAIL" in body[: body.index("<table")]
    ok = _page(dirs.run_ok)
    assert 'class="banner pass"' in ok and "banner fail" not in ok


def test_the_sweep_and_compare_pages_show_intervals_and_the_pairs_label(dirs: ReportDirs) -> None:
    fields = {path for path, _ in scan(_page(dirs.sweep)).fields}
    assert {"stats[0].figures.output_tokens_per_s.low", "stats[1].figures.realized_al.high",
            "stats[1].figures.tokens_per_s_per_user.mean"} <= fields  # fmt: skip
    assert "Throughput against interactivity" in _page(dirs.sweep)
    compare = _page(dirs.compare)
    assert 'class="banner pass"' in compare
    assert "at 44 tok/s/user, B delivers" in compare
    assert "pairs[0].deltas.matched_concurrency[0].ratio" in {p for p, _ in scan(compare).fields}


def test_field_paths_name_one_place_even_for_odd_keys() -> None:
    data = {"a": {"b.c": [1, {"d e": 2}], "[x]": 3, 'q"': 4}}
    for parts, value in (
        (("a", "b.c", 0), 1), (("a", "b.c", 1, "d e"), 2), (("a", "[x]"), 3), (("a", 'q"'), 4),
    ):  # fmt: skip
        assert resolve_field(data, field_path(*parts)) == value
    assert field_path("figures", "latency_ms", "ttft", "mean") == "figures.latency_ms.ttft.mean"
    with pytest.raises(KeyError):
        resolve_field(data, "a.missing")


def _record(i: int) -> RequestRecord:
    steps, accepted = 10, 27 + i % 3
    return RequestRecord(
        index=i, category=f"cat{i % 7}", start=i * 0.01, end=i * 0.01 + 0.2 + (i % 97) * 1e-3,
        ttft=0.05 + (i % 89) * 1e-4, itl_runs=[(0.002, 40)], prompt_tokens=64,
        completion_tokens=40, finish_reason="length", status=200, spec_status="ok",
        spec={"mean_acceptance_length": 1 + accepted / steps, "num_spec_steps": steps,
              "num_accepted_draft_tokens": accepted},
    )  # fmt: skip


def _big_summary(n: int) -> dict[str, object]:
    hist = {"2": n * 3, "3": n * 7}
    return {
        "settings": {"model": "big", "concurrency": 64},
        "figures": {
            "requests": {"sent": n, "completed": n, "failed": 0, "warmup": 0},
            "duration_s": 100.0, "interrupted": False,
            "throughput": {"requests_per_s": n / 100, "output_tokens_per_s": 40 * n / 100},
            "latency_ms": {"ttft": {"mean": 50.0, "p50": 50.0, "p90": 58.0, "p99": 59.0,
                                    "min": 50.0, "max": 59.0}},
            "acceptance": {"token_weighted_al": 3.8, "verify_steps": 10 * n, "histogram": hist,
                           "per_position_rates": [1.0, 1.0, 0.7, 0.0],
                           "al_by_category": {f"cat{c}": {"al": 3.8, "verify_steps": n}
                                              for c in range(7)}},
        },
    }  # fmt: skip


def test_a_run_of_100k_requests_renders_in_bounded_time_and_size(tmp_path: Path) -> None:
    """Plots come from aggregates and at most CDF_POINTS / SCATTER_POINTS samples, from the
    records in memory (bench's path) and from records.jsonl (a report made later)."""
    n = 100_000
    records = [_record(i) for i in range(n)]
    (tmp_path / "summary.json").write_bytes(orjson.dumps(_big_summary(n)))
    start = time.monotonic()
    write_run_report(tmp_path, records)
    in_memory = time.monotonic() - start
    size = (tmp_path / "report.html").stat().st_size
    assert size < 1_500_000
    assert "(1500 of 100000 requests)" in _page(tmp_path)
    with (tmp_path / "records.jsonl").open("wb") as fh:
        fh.writelines(orjson.dumps(record_row(r)) + b"\n" for r in records)
    start = time.monotonic()
    samples = samples_from_file(tmp_path / "records.jsonl")  # what write_run_report(dir) reads
    from_file = time.monotonic() - start
    assert len(samples.al_tpot()) == n and samples.note is None
    assert in_memory < 30 and from_file < 30, (in_memory, from_file)  # s, on a loaded 2-core box
