"""``speclens compare RUN_OR_SWEEP...``: comparability checks first, then deltas with intervals.

Exit codes: 0 every pair comparable; 1 a pair is not comparable (its deltas are labelled so),
or an input file is invalid or tampered (one line per problem); 2 usage: bad options, a
directory that is not a run or a sweep, runs of different models.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.markup import escape

from speclens.cli._common import err_console, fail, out_console

MAX_GPUS = 4096


def _gpus(values: list[int], count: int) -> list[int]:
    bad = [v for v in values if not 1 <= v <= MAX_GPUS]
    if bad:
        fail(f"command line: --gpus: expected an integer in [1, {MAX_GPUS}], got {bad[0]}", 2)
    if len(values) not in (0, 1, count):
        fail(f"command line: --gpus: expected one value for every input or one per input "
             f"({count}), got {len(values)}", 2)  # fmt: skip
    return values * count if len(values) == 1 else values or [1] * count


def compare(
    inputs: list[Path] = typer.Argument(
        ..., help="Run directories (bench --output-dir) or sweep directories, two or more."
    ),
    label: list[str] = typer.Option(
        [], "--label", help="A name for each input, in order (default A, B, C, ...)."
    ),
    gpus: list[int] = typer.Option(
        [], "--gpus", help="GPUs behind each input, for tok/s/GPU: once for all, or once per input."
    ),
    differ: list[str] = typer.Option(
        [], "--differ", help="A difference you mean to compare across: k (K, and so acceptance)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print compare.json's object only."),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", help="Write compare.json and report.html there."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap over one round's requests."),
) -> None:
    """Compare runs and sweeps of any engine: same prompts, sampling, lengths, K and acceptance
    first, then throughput at matched concurrency and at matched interactivity, with 95% CIs."""
    from speclens.acceptance import ValidationError
    from speclens.runs import compare as cmp
    from speclens.runs.rundir import InputError

    if len(inputs) < 2:
        fail("command line: INPUTS: expected two or more run or sweep directories", 2)
    if len(inputs) > cmp.MAX_INPUTS:
        fail(f"command line: INPUTS: at most {cmp.MAX_INPUTS}, got {len(inputs)}", 2)
    unknown = sorted(set(differ) - set(cmp.NAMEABLE))
    if unknown:
        fail(f"command line: --differ: expected one of {', '.join(cmp.NAMEABLE)}, got "
             f"{unknown[0]!r}", 2)  # fmt: skip
    if not 0 <= seed <= 2**32 - 1:
        fail(f"command line: --seed: expected an integer in [0, 2**32 - 1], got {seed}", 2)
    counts = _gpus(gpus, len(inputs))
    try:
        labels = cmp.labels_for(len(inputs), label)
        read = cmp.read_inputs(inputs, labels, counts)
        result = cmp.compare(read, differ, seed)
    except ValidationError as exc:
        fail([str(p) for p in exc.problems], 2)
    except InputError as exc:
        fail(exc.lines, exc.code)
    if output_dir is not None:
        _write(output_dir, result)
    if json_out:
        typer.echo(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        _print(result)
    raise typer.Exit(0 if all(p["comparable"] for p in result["pairs"]) else 1)


def _write(output_dir: Path, result: dict[str, Any]) -> None:
    from speclens.runs.files import open_new
    from speclens.runs.html import ReportError, write_compare_report

    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with open_new(output_dir / "compare.json") as fh:
            fh.write(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        written = write_compare_report(output_dir, result)
    except (OSError, ReportError) as exc:
        fail(f"{output_dir}: cannot write the report: {exc}", 1)
    err_console.print(f"wrote {output_dir / 'compare.json'}", markup=False)
    err_console.print(f"wrote {written}", markup=False)


def _ratio(row: dict[str, Any]) -> str:
    r, low, high = row["ratio"], row["ratio_low"], row["ratio_high"]
    if r is None:
        return "no ratio (a figure has no data)"
    if low is None or high is None or not math.isfinite(low):
        return f"{r:.2f}x (no interval)"
    return f"{r:.2f}x (95% CI {low:.2f}x to {high:.2f}x)"


def _print(result: dict[str, Any]) -> None:
    for item in result["inputs"]:
        gpus = f"{item['gpus']} GPU" + ("s" if item["gpus"] > 1 else "")
        out_console.print(
            f"{escape(item['label'])} = {escape(item['path'])} ({item['kind']}, model "
            f"{escape(item['model'])}, engine {escape(str(item['engine'] or 'unknown'))}, {gpus})"
        )
    for pair in result["pairs"]:
        a, b, ok = pair["a"], pair["b"], pair["comparable"]
        style = "bold green" if ok else "bold red"
        out_console.print(f"\n[{style}]{escape(a)} vs {escape(b)}: {escape(pair['label'])}[/]")
        for check in pair["checks"]:
            word = "[green]ok  [/]" if check["ok"] else "[red]FAIL[/]"
            out_console.print(f"  {word} {check['name']}: {escape(check['detail'])}")
        tag = "" if ok else "NOT COMPARABLE: "
        for row in pair["deltas"]["matched_concurrency"]:
            load = (f"concurrency {row['concurrency']}" if row["concurrency"] is not None
                    else f"request rate {row['request_rate']:g}/s")  # fmt: skip
            out_console.print(
                f"  {tag}{load}: {row['figure']} {escape(b)}/{escape(a)} {_ratio(row)}"
            )
        for row in pair["deltas"]["matched_interactivity"]:
            out_console.print(f"  {escape(row['sentence'])}")
        note = pair["deltas"].get("interactivity_note")
        if note:
            out_console.print(f"  interactivity: {escape(note)}")
        for i, line in enumerate(fidelity_lines(pair)):
            indent = "  " if i == 0 else "    "  # the header, then one line a figure
            out_console.print(f"{indent}{tag}{escape(line)}")


def fidelity_lines(pair: dict[str, Any]) -> list[str]:
    """The pair's fidelity block (B's per-request error against A, the observed run), one line
    a figure; none when compare made none (a sweep, or too few requests in common)."""
    fid = pair.get("fidelity")
    if not fid:
        return []
    lines = [f"fidelity of {pair['b']} against {pair['a']}, request by request: "
             f"{fid['matched']} matched by index, {fid['unmatched']} left out"]  # fmt: skip
    for name, e in fid["figures"].items():
        n = e["requests"]
        if not n:
            lines.append(f"{name.upper()}: no matched request reports it")
            continue
        lines.append(
            f"{name.upper()}: median error {_pct(e['median_ape'])}, P90 {_pct(e['p90_ape'])}, "
            f"MAPE {_pct(e['mape'])}, bias {_pct(e['bias'], '+')} "
            f"({n} request{'s' if n != 1 else ''})"
        )
    error = fid["throughput_error"]
    missing = f"unknown (no output tokens/s for {pair['a']})"
    lines.append("throughput: " + (missing if error is None else _pct(error, "+")))
    return lines


def _pct(value: float | None, sign: str = "") -> str:
    """A fraction as a percentage; "unknown" for an error too large for a float (null, or one
    whose percentage is past the largest float)."""
    if value is None or not math.isfinite(value * 100):
        return "unknown"
    return f"{value:{sign}.1%}"
