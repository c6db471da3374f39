"""``speclens report PATH...``: write report.html again, plots included, for run and sweep
directories already on disk.

A PATH is a run directory (``summary.json``, with ``records.jsonl`` when it has one), a sweep
directory (``sweep.json``, and ``decision.json`` when ``sim --at-interactivity`` wrote one), or a
directory holding such directories one level down (what ``speclens import inferencex`` writes:
it draws no plots, since they would be most of its time). Each page is written from the files
alone, so a report can be drawn on another machine than the run's.

Exit codes: 0 every report written; 1 a file a report reads is missing, unreadable or not what
its writer writes (one line each, naming it; the other reports are still written); 2 a PATH that
is none of the above.
"""

from __future__ import annotations

from pathlib import Path

import typer

from speclens.cli._common import err_console, fail, out_console


def _targets(path: Path) -> list[Path]:
    """The run and sweep directories ``path`` names: itself, or its children one level down."""
    if _kind(path):
        return [path]
    if path.is_dir():
        return sorted(child for child in path.iterdir() if child.is_dir() and _kind(child))
    return []


def _kind(path: Path) -> str | None:
    if (path / "sweep.json").is_file():
        return "sweep"
    if (path / "summary.json").is_file():
        return "run"
    return None


def _write(target: Path) -> Path:
    """The target's report.html; ReportError for a file it reads that is not as expected."""
    from speclens.runs.html import read_json
    from speclens.runs.html_run import write_run_report
    from speclens.runs.html_sweep import write_sweep_report

    if _kind(target) == "run":
        return write_run_report(target)
    decision_file = target / "decision.json"
    decision = read_json(decision_file) if decision_file.is_file() else None
    return write_sweep_report(target, decision)


def report(
    paths: list[Path] = typer.Argument(
        ..., help="Run or sweep directories, or a directory of them (an import's --output-dir)."
    ),
) -> None:
    """Write report.html (plots included) for run and sweep directories from their files."""
    from speclens.runs.html import ReportError

    targets: list[Path] = []
    for path in paths:
        found = _targets(path)
        if not found:
            fail(f"{path}: no summary.json or sweep.json here or one level down: expected a run "
                 "or sweep directory, or a directory of them", 2)  # fmt: skip
        targets += found
    unique = list(dict.fromkeys(targets))  # a directory named twice is written once
    problems = 0
    for target in unique:
        try:
            written = _write(target)
        except ReportError as exc:
            err_console.print(str(exc), markup=False)
            problems += 1
            continue
        except OSError as exc:
            err_console.print(f"{exc.filename or target}: cannot be written: "
                              f"{exc.strerror or exc}", markup=False)  # fmt: skip
            problems += 1
            continue
        if len(unique) <= 20:
            out_console.print(f"wrote {written}", markup=False, highlight=False)
    out_console.print(f"wrote {len(unique) - problems:,} report(s)"
                      + (f", {problems:,} refused" if problems else ""),
                      markup=False, highlight=False)  # fmt: skip
    if problems:
        raise typer.Exit(1)
