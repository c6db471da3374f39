"""``speclens import``: published results as aggregate-only runs.

``speclens import inferencex FILE... --output-dir DIR [--where KEY=VALUE ...] [--plots]`` writes
one sweep directory per configuration (``DIR/<name>/``, a run per concurrency; the sweep
reports' plots only with ``--plots``, or later with ``speclens report DIR``); ``speclens import vllm
FILE --output-dir DIR`` writes one run directory from a ``vllm bench serve --save-result`` file.
Every file is read and checked before anything is written, and every directory is built aside
and renamed into place, so a refused import writes nothing. An interrupted one writes nothing
either: Ctrl-C, and SIGTERM, SIGHUP or another terminating signal (taken as a Ctrl-C while the
import reads and writes), removes what the import had written.

Exit codes: 0 written; 1 an invalid or oversized file (one line naming the file, the point and
the field), or a filter that matches no point; 2 usage: bad options, an unknown ``--where`` key,
an output directory that exists and is not empty (``vllm``) or a configuration directory that
exists (``inferencex``); 130 interrupted (one line), nothing written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from speclens.cli._common import fail, out_console

MAX_GPUS = 4096
_CHIP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")

app = typer.Typer(
    help="Published results (InferenceX, vllm bench serve) as aggregate-only runs.",
    no_args_is_help=True,
)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


@contextmanager
def _all_or_nothing(command: str) -> Iterator[list[str]]:
    """For the block, a terminating signal acts as a Ctrl-C (``sweep_server.interrupts``): the
    writer's clean-up removes what it wrote, and the command exits 130 with one line. Yields the
    signals seen, for the writer to check between configurations: a KeyboardInterrupt raised
    while Python runs a finalizer is printed and dropped, never reaching the writer."""
    from speclens.runs.sweep_server import interrupts

    with interrupts() as signals:
        try:
            yield signals
        except KeyboardInterrupt:
            how = signals[0] if signals else "Ctrl-C"
            fail(f"import {command}: interrupted ({how}): nothing written", 130)


@app.command("inferencex")
def inferencex(
    files: list[Path] = typer.Argument(
        ..., help="InferenceX benchmark files (benchmarks.json, benchmarks-history.json)."
    ),
    output_dir: Path = typer.Option(
        ..., "--output-dir", help="Where each configuration's sweep directory is written."
    ),
    where: list[str] = typer.Option(
        [], "--where",
        help="KEY=VALUE: keep points whose published KEY reads VALUE (e.g. hardware=mi355x, "
        "spec_method=none, date=2026-05-27). Repeatable: different keys must all match; "
        "values given for one key are alternatives.",
    ),
    plots: bool = typer.Option(
        False, "--plots/--no-plots",
        help="Draw each sweep report's plots now (most of an import's time; `speclens report "
        "DIR` draws them later).",
    ),
) -> None:  # fmt: skip
    """Each configuration (model, chip, engine, precision, lengths, parallelism, speculation,
    date) of InferenceX's published points becomes a sweep directory with one aggregate-only
    run per concurrency. Its report.html has the tables; the plots wait for ``--plots`` or
    ``speclens report``."""
    from speclens.runs import published, published_read
    from speclens.runs.rundir import InputError

    with _all_or_nothing("inferencex") as signals:
        try:
            filters = published_read.parse_where(where)
            points = [p for path in files for p in published_read.read_inferencex(path, str(path))]
            unique, merged = published_read.dedupe(points)
            chosen = published_read.select(unique, filters)
            if not chosen:
                shown = " ".join(f"{k}={v}" for k, v in filters)
                fail(f"command line: --where {shown}: no point matches ({len(unique):,} "
                     f"published points read from {len(files)} file(s))", 1)  # fmt: skip
            sweeps = published_read.configurations(chosen)
            published.write_sweeps(output_dir, sweeps, stopped=lambda: bool(signals), plots=plots)
        except InputError as exc:
            fail(exc.lines, exc.code)
        except OSError as exc:
            fail(f"{exc.filename or output_dir}: cannot be written: {exc.strerror or exc}", 1)
    for name, runs in sweeps.items():
        concurrencies = ", ".join(str(r["settings"]["concurrency"]) for r in runs)
        out_console.print(f"{name}: {_count(len(runs), 'point')} (concurrency {concurrencies})",
                          markup=False, highlight=False)  # fmt: skip
    total = sum(len(r) for r in sweeps.values())
    duplicates = f", {_count(merged, 'duplicate')} merged" if merged else ""
    out_console.print(
        f"imported {_count(len(sweeps), 'configuration')}, {_count(total, 'point')} (of "
        f"{len(points):,} read"
        f"{duplicates}) into {output_dir}", markup=False, highlight=False,
    )  # fmt: skip


@app.command("vllm")
def vllm(
    file: Path = typer.Argument(..., help="A vllm bench serve --save-result JSON file."),
    output_dir: Path = typer.Option(..., "--output-dir", help="The run directory to write."),
    gpus: int | None = typer.Option(
        None, "--gpus", help="GPUs the server ran on: throughput per GPU (else none is stated)."
    ),
    hardware: str | None = typer.Option(
        None, "--hardware", help="The chip's catalog name (e.g. h100), recorded in the settings."
    ),
) -> None:
    """One ``vllm bench serve --save-result`` file as an aggregate-only run directory."""
    from speclens.runs import published, published_read
    from speclens.runs.rundir import InputError

    if gpus is not None and not 1 <= gpus <= MAX_GPUS:
        fail(f"command line: --gpus: expected an integer in [1, {MAX_GPUS}], got {gpus}", 2)
    if hardware is not None and not _CHIP.match(hardware):
        fail(f"command line: --hardware: expected a chip name (letters, digits, '.', '_', '+', "
             f"'-'; at most 64), got {hardware[:80]!r}", 2)  # fmt: skip
    with _all_or_nothing("vllm"):
        try:
            summary = published_read.vllm_summary(file, str(file), gpus, hardware)
            published.write_point(output_dir, summary)
        except InputError as exc:
            fail(exc.lines, exc.code)
        except OSError as exc:
            fail(f"{exc.filename or output_dir}: cannot be written: {exc.strerror or exc}", 1)
    settings = summary["settings"]
    load = (f"concurrency {settings['concurrency']}" if settings["concurrency"] is not None
            else f"request rate {settings['request_rate'] or 'inf'}")  # fmt: skip
    out_console.print(f"imported {settings['model']} ({load}) into {output_dir}",
                      markup=False, highlight=False)  # fmt: skip
