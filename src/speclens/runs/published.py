"""Published results as runs: the writer of aggregate-only run directories and their sweeps.

A published result (an InferenceX point, a ``vllm bench serve --save-result`` file) or a
prediction of one is a run directory holding ``summary.json`` (bench's shape, marked
``"aggregate_only": true``) and ``report.html``, and no ``records.jsonl``: nothing per request
exists. A configuration measured at several concurrencies is a sweep directory of such runs:
``sweep.json`` (schema ``speclens.sweep/1``, written by ``runs.sweep.Sweep`` as a sweep of
concurrencies writes it), ``sweep.csv``, ``report.html`` and ``points/c<concurrency>/``.

Every directory is built whole in a hidden sibling and renamed into place, so a refused, failed
or interrupted write leaves nothing behind (its clean-up holds further signals until it is
done); a target that exists and is not empty is refused, as is a summary its readers could not
read back (over ``rundir.MAX_FILE_BYTES`` as JSON, or not JSON at all). The readers of published
files are ``runs.published_read``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from speclens.runs.files import open_new
from speclens.runs.rundir import MAX_FILE_BYTES, InputError
from speclens.runs.sweep import Sweep
from speclens.runs.sweep_points import Point
from speclens.runs.sweep_server import held

#: ``provenance.source`` of each kind of published result.
SOURCES = ("inferencex", "vllm", "speclens-sim")


def is_aggregate_only(summary: object) -> bool:
    """A summary of published (or predicted) figures only: no records.jsonl beside it."""
    return isinstance(summary, dict) and summary.get("aggregate_only") is True


def point_id(summary: Mapping[str, Any]) -> str:
    """A sweep point's id, ``c<concurrency>``; ValueError when the summary has no concurrency."""
    concurrency = (summary.get("settings") or {}).get("concurrency")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"settings.concurrency: expected an integer >= 1, got {concurrency!r:.60}")
    return f"c{concurrency}"


def _refuse_existing(target: Path) -> None:
    """InputError (usage, 2) when ``target`` exists as anything but an empty directory."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise InputError([f"{target}: exists and is not a directory: expected a new directory"], 2)
    if target.is_dir() and any(target.iterdir()):
        raise InputError([f"{target}: exists and is not empty: expected a new directory"], 2)


@contextlib.contextmanager
def _staged(target: Path) -> Iterator[Path]:
    """A hidden sibling of ``target`` to build in, renamed onto ``target`` when the block ends
    without an error and removed when it raises."""
    _refuse_existing(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        if stage.exists() or stage.is_symlink():
            _remove(stage)
        stage.mkdir()
        yield stage
        if target.is_dir() and not target.is_symlink():
            target.rmdir()  # empty (checked): the rename needs the name free
        os.rename(stage, target)
    except BaseException:
        with held():  # a second Ctrl-C or SIGTERM must not cut the clean-up short
            _remove(stage)
        raise


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _encoded(summary: Mapping[str, Any], where: str) -> bytes:
    """summary.json's bytes; InputError (1) for a summary its readers could not read back."""
    try:
        data = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as exc:
        raise InputError([f"{where}: summary.json: cannot be written as JSON: {exc}"], 1) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError([f"{where}: summary.json: {len(data):,} bytes: expected at most "
                          f"{MAX_FILE_BYTES:,} (what its readers read)"], 1)  # fmt: skip
    return data


def _fill_point(run_dir: Path, summary: Mapping[str, Any], where: str) -> None:
    """summary.json and report.html into the (new, empty) ``run_dir``."""
    from speclens.runs.html_run import write_run_report

    data = _encoded(summary, where)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open_new(run_dir / "summary.json") as fh:
        fh.write(data)
    write_run_report(run_dir, records=[])


def _checked(summary: Mapping[str, Any], where: str) -> None:
    if not is_aggregate_only(summary):
        raise ValueError('expected an aggregate-only summary ("aggregate_only": true)')
    _encoded(summary, where)


def write_point(run_dir: Path, summary: dict[str, Any]) -> None:
    """One aggregate-only run directory (summary.json and report.html), built in a hidden
    sibling and renamed into place. InputError (2) when ``run_dir`` exists and is not empty;
    ValueError for a summary that is not aggregate-only."""
    _checked(summary, str(run_dir))
    with _staged(Path(run_dir)) as stage:
        _fill_point(stage, summary, str(run_dir))


def _engine(summaries: Sequence[Mapping[str, Any]]) -> str | None:
    engines = {(s.get("settings") or {}).get("engine") for s in summaries}
    one = engines.pop() if len(engines) == 1 else None
    return one if isinstance(one, str) else None


def _fill_sweep(
    root: Path, points: Sequence[Mapping[str, Any]], where: str, plots: bool = True
) -> None:
    """The points' run directories, then sweep.json and sweep.csv as ``Sweep`` writes them
    (each point read back through ``points.summarize``), then the sweep's report.html (its
    plots only with ``plots``)."""
    from speclens.runs.html_sweep import write_sweep_report

    ids = [point_id(p) for p in points]
    seen = {i for i in ids if ids.count(i) > 1}
    if seen:
        raise ValueError(f"concurrency given twice in one sweep: {', '.join(sorted(seen))}")
    order = sorted(range(len(points)), key=lambda i: int(ids[i][1:]))
    engine = _engine(points)
    concurrencies = [int(ids[i][1:]) for i in order]
    sweep = Sweep(root, "load", 1, {"concurrency": concurrencies})
    for i in order:
        settings = points[i].get("settings") or {}
        _fill_point(root / "points" / ids[i], points[i], f"{where}/points/{ids[i]}")
        sweep.points.append(
            Point(ids[i], engine, {
                "concurrency": int(ids[i][1:]), "request_rate": None,
                "num_speculative_tokens": settings.get("num_spec_tokens"),
                "acceptance_length": None,
            }, 0, f"points/{ids[i]}")
        )  # fmt: skip
    for point in sweep.points:
        sweep.record(point, 0)
    write_sweep_report(root, plots=plots)


def write_sweep(sweep_dir: Path, points: list[dict[str, Any]], plots: bool = True) -> None:
    """A sweep directory of aggregate-only runs, one per concurrency (ids ``c<concurrency>``):
    ``points/<id>/``, sweep.json, sweep.csv and report.html, built in a hidden sibling and
    renamed into place. InputError (2) when ``sweep_dir`` exists and is not empty; ValueError
    for no points, a summary that is not aggregate-only, or a concurrency given twice. The
    report's plots are drawn only with ``plots``: they are most of an import's time."""
    if not points:
        raise ValueError("expected at least one point")
    for summary in points:
        _checked(summary, f"{sweep_dir}/points/{point_id(summary)}")
    with _staged(Path(sweep_dir)) as stage:
        _fill_sweep(stage, points, str(sweep_dir), plots)


def write_sweeps(
    root: Path,
    sweeps: Mapping[str, list[dict[str, Any]]],
    stopped: Callable[[], bool] | None = None,
    plots: bool = True,
) -> list[Path]:
    """Every sweep ``root/<name>``, all or none: every target is checked before the first is
    written (InputError 2 names the first that exists), and a failure part way removes the
    sweeps this call already wrote (and ``root`` when this call made it). ``stopped()`` is asked
    after each sweep and once all are written: true, it is an interrupt (KeyboardInterrupt)."""
    targets = [Path(root) / name for name in sweeps]
    existing = [t for t in targets if t.exists() or t.is_symlink()]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise InputError([f"{existing[0]}: the configuration directory exists{more}: expected "
                          "a new directory (choose another --output-dir)"], 2)  # fmt: skip
    made_root = not Path(root).exists()
    started: list[Path] = []  # each target once its write began: none existed before
    try:
        for target, points in zip(targets, sweeps.values(), strict=True):
            started.append(target)
            write_sweep(target, points, plots)
            if stopped is not None and stopped():
                raise KeyboardInterrupt
    except BaseException:
        with held():  # a second Ctrl-C or SIGTERM must not cut the clean-up short
            for target in started:
                _remove(target)
            if made_root:
                with contextlib.suppress(OSError):
                    Path(root).rmdir()
        raise
    return started
