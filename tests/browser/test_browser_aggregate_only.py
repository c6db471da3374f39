"""Aggregate-only reports in a real browser (the tier of test_browser_reports.py): a published
run's page, a sweep of published points, and a compare of a speculation A/B and of a
prediction against its measurement load with no console error, no exception and no request
but the file itself (the run's URL is a link, never fetched); the DOM's numbers equal the JSON."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cdp import Browser
from chromium_env import ensure_chromium

from aggregatekit import summary, write_point, write_sweep
from reportkit import field_mismatches
from speclens.runs import compare as cmp
from speclens.runs.compare_inputs import labels_for, read_inputs
from speclens.runs.html_aggregate import AGGREGATE_LINE
from speclens.runs.html_compare import write_compare_report
from speclens.runs.html_run import write_run_report
from speclens.runs.html_sweep import write_sweep_report

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser(ensure_chromium())
    yield b
    b.close()


def _compare(out: Path, *paths: Path) -> Path:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [None] * len(paths))
    out.mkdir()
    (out / "compare.json").write_bytes(orjson.dumps(cmp.compare(inputs)))
    write_compare_report(out, out / "compare.json")
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, str]]:
    root = tmp_path_factory.mktemp("aggregate-reports")
    run = write_point(root / "run", summary(method="mtp", k=3))
    write_run_report(run)
    off = write_sweep(root / "off", [summary(concurrency=c, tpot_p50=6.0 * c**0.5,
                                             total_per_gpu=300.0 * c**0.6) for c in (4, 8, 16, 32)])  # fmt: skip
    on = write_sweep(root / "on", [summary(concurrency=c, tpot_p50=3.5 * c**0.5, method="mtp",
                                           k=3, total_per_gpu=330.0 * c**0.6) for c in (4, 8, 16, 32)])  # fmt: skip
    predicted = write_sweep(root / "pred", [summary(concurrency=c, tpot_p50=5.0 * c**0.5,
                                                    executor="sim", total_per_gpu=280.0 * c**0.6)
                                            for c in (4, 8, 16, 32)])  # fmt: skip
    write_sweep_report(off)
    return {
        "aggregate run": (run, "summary.json", "figures.latency_ms.tpot.p50"),
        "aggregate sweep": (off, "sweep.json", "stats[0].figures.tpot_ms.mean"),
        "speculation A/B": (_compare(root / "ab", off, on), "compare.json",
                            "pairs[0].speculation.headline.delta_pct"),
        "prediction": (_compare(root / "fid", off, predicted), "compare.json",
                       "pairs[0].fidelity.median_abs_error.tpot_p50_ms"),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["aggregate run", "aggregate sweep", "speculation A/B", "prediction"])  # fmt: skip
def test_aggregate_reports_load_clean_and_their_dom_equals_the_json(
    name: str, pages: dict[str, tuple[Path, str, str]], browser: Browser
) -> None:
    directory, source, key = pages[name]
    loaded = browser.load(directory / "report.html")
    assert loaded.console_errors == [] and loaded.exceptions == []
    assert loaded.requests == [loaded.url]
    data = orjson.loads((directory / source).read_bytes())
    assert len(loaded.fields) > 10
    assert field_mismatches([(p, t) for p, t, _ in loaded.fields], data) == []
    assert key in {p for p, _, shown in loaded.fields if shown}, f"{key} is not on screen"
    if name == "aggregate run":
        assert AGGREGATE_LINE in (directory / "report.html").read_text()
