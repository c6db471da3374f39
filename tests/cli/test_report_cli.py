"""``speclens report``: an import draws no plots (they were 80% of importing InferenceX's 968
configurations), says so where they would be, and ``speclens report`` (or ``import --plots``)
draws them from the files on disk; run directories, sweep directories and a directory of them."""

from __future__ import annotations

import json
from pathlib import Path

from publishedkit import point, write_points
from speclens.runs.html_sweep import PLOTS_NOT_DRAWN

NAME = "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27"
OTHER = "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-27"


def _import(run_cli, tmp_path: Path, *extra: str) -> Path:
    points = [point(conc=c) for c in (4, 8, 64)] + [point(conc=4, spec_method="mtp")]
    src = write_points(tmp_path / "points.json", points)
    out = tmp_path / "out"
    code, _, stderr = run_cli("import", "inferencex", src, "--output-dir", out, *extra)
    assert code == 0, stderr
    return out


def _plots(page: Path) -> int:
    return page.read_text().count("<svg")


def test_an_import_leaves_the_plots_for_report_which_draws_them(run_cli, tmp_path):
    out = _import(run_cli, tmp_path)
    page = out / NAME / "report.html"
    assert _plots(page) == 0 and PLOTS_NOT_DRAWN in page.read_text()
    tables = page.read_text().count("<table")
    code, stdout, stderr = run_cli("report", out / NAME)
    assert code == 0, stderr
    assert stdout.splitlines() == [f"wrote {page}", "wrote 1 report(s)"]
    assert _plots(page) == 1 and PLOTS_NOT_DRAWN not in page.read_text()
    assert page.read_text().count("<table") == tables  # the same page, plots added
    assert _plots(out / OTHER / "report.html") == 0  # only the directory named


def test_report_on_an_import_directory_draws_every_configuration(run_cli, tmp_path):
    out = _import(run_cli, tmp_path)
    code, stdout, _ = run_cli("report", out)
    assert code == 0 and stdout.splitlines()[-1] == "wrote 2 report(s)"
    assert [_plots(out / n / "report.html") for n in (NAME, OTHER)] == [1, 1]


def test_import_with_plots_draws_them_at_once(run_cli, tmp_path):
    out = _import(run_cli, tmp_path, "--plots")
    assert _plots(out / NAME / "report.html") == 1


def test_a_run_directory_s_report_is_written_from_its_summary(run_cli, tmp_path):
    out = _import(run_cli, tmp_path)
    run = out / NAME / "points" / "c8"
    (run / "report.html").unlink()
    code, _, stderr = run_cli("report", run)
    assert code == 0, stderr
    assert "aggregate" in (run / "report.html").read_text()


def test_a_path_that_is_no_run_or_sweep_is_refused(run_cli, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, stderr = run_cli("report", tmp_path / "empty")
    assert code == 2
    assert stderr.strip() == (f"{tmp_path / 'empty'}: no summary.json or sweep.json here or one "
                              "level down: expected a run or sweep directory, or a directory of "
                              "them")  # fmt: skip


def test_a_bad_sweep_is_named_and_the_others_are_still_written(run_cli, tmp_path):
    out = _import(run_cli, tmp_path)
    (out / NAME / "sweep.json").write_text(json.dumps({"schema": "other/1"}))
    code, stdout, stderr = run_cli("report", out)
    assert code == 1
    assert str(out / NAME / "sweep.json") in stderr and len(stderr.strip().splitlines()) == 1
    assert stdout.splitlines()[-1] == "wrote 1 report(s), 1 refused"
    assert _plots(out / OTHER / "report.html") == 1
