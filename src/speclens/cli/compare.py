"""``speclens compare RUN_OR_SWEEP...``: comparability checks first, then deltas with intervals.

Exit codes: 0 every pair comparable (or comparable as a speculation A/B, or as a prediction
against a measurement); 1 a pair is not comparable (its deltas are labelled so), or has published
figures only (checks that need per-request data did not run), or an input file is invalid or
tampered (one line per problem); 2 usage: bad options, a directory that is not a run or a
sweep, runs of different models.
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


def _gpus(values: list[int], count: int) -> list[int | None]:
    """One per input; None where not given (an aggregate-only input's own GPUs, else 1)."""
    bad = [v for v in values if not 1 <= v <= MAX_GPUS]
    if bad:
        fail(f"command line: --gpus: expected an integer in [1, {MAX_GPUS}], got {bad[0]}", 2)
    if len(values) not in (0, 1, count):
        fail(f"command line: --gpus: expected one value for every input or one per input "
             f"({count}), got {len(values)}", 2)  # fmt: skip
    given: list[int | None] = list(values * count if len(values) == 1 else values)
    return given or [None] * count


def compare(
    inputs: list[Path] = typer.Argument(
        ...,
        help="Run directories (bench --output-dir, or aggregate-only ones from speclens import) "
        "or sweep directories, two or more.",
    ),
    label: list[str] = typer.Option(
        [],
        "--label",
        help="A name for each input, in order (default: the directory names, or A, B, C, ... where they repeat).",
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
    at_interactivity: float | None = typer.Option(
        None,
        "--at-interactivity",
        metavar="X",
        help="Which input delivers the most tok/s/GPU at X tok/s/user (each input's own "
        "curve, interpolated, with its interval; published and predicted inputs labelled): "
        "said first.",
    ),
    metric: str = typer.Option(
        "total",
        "--metric",
        metavar="output|total",
        help="The throughput stated everywhere: total (input + output) tokens/s per GPU, "
        "InferenceX's throughput per GPU, or output tokens/s per GPU.",
    ),
) -> None:
    """Compare runs and sweeps of any engine: same prompts, sampling, lengths, K and acceptance
    first, then throughput at matched concurrency and at matched interactivity, with 95% CIs.
    One sweep over K alone: its Ks compared. Aggregate-only inputs (published figures): a
    speculation A/B, or a prediction's error."""
    from speclens.acceptance import ValidationError
    from speclens.runs import compare as cmp
    from speclens.runs import compare_decide as cd
    from speclens.runs.compare_checks import NAMEABLE
    from speclens.runs.compare_deltas import METRICS
    from speclens.runs.compare_inputs import MAX_INPUTS, labels_for, read_inputs
    from speclens.runs.rundir import InputError

    whole = cd.sweep_dir_path(inputs)
    if len(inputs) < 2 and whole is None:
        fail("command line: INPUTS: expected two or more run or sweep directories, or one "
             "sweep directory over K (num_speculative_tokens)", 2)  # fmt: skip
    if len(inputs) > MAX_INPUTS:
        fail(f"command line: INPUTS: at most {MAX_INPUTS}, got {len(inputs)}", 2)
    unknown = sorted(set(differ) - set(NAMEABLE))
    if unknown:
        fail(f"command line: --differ: expected one of {', '.join(NAMEABLE)}, got "
             f"{unknown[0]!r}", 2)  # fmt: skip
    if not 0 <= seed <= 2**32 - 1:
        fail(f"command line: --seed: expected an integer in [0, 2**32 - 1], got {seed}", 2)
    if at_interactivity is not None and not 0 < at_interactivity <= cd.MAX_TARGET:
        fail(f"command line: --at-interactivity: expected tok/s/user in (0, {cd.MAX_TARGET:g}], "
             f"got {at_interactivity:g}", 2)  # fmt: skip
    if metric not in METRICS:
        fail(f"command line: --metric: expected one of {', '.join(METRICS)}, got {metric!r:.60}",
             2)  # fmt: skip
    counts = _gpus(gpus, len(inputs))
    try:
        labels = labels_for(len(inputs), label, inputs)
        read = read_inputs(inputs, labels, counts)
        named = list(differ)
        if whole is not None:
            read, named = cd.whole_sweep(read, named)
        result = cmp.compare(read, named, seed, metric, at_interactivity)
        if whole is not None:  # each choice against the first, not every pair
            result["pairs"] = [p for p in result["pairs"] if p["a"] == read[0].label]
            result["sweep"] = str(whole)
            for entry, item in zip(result["inputs"], read, strict=True):
                entry["select"] = cd.selection(item)
        if at_interactivity is not None:
            result["decision"] = cd.decide(read, at_interactivity, by_k=whole is not None,
                                           metric=metric)  # fmt: skip
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
    from speclens.runs.html import ReportError
    from speclens.runs.html_compare import write_compare_report

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
        return f"{r:.2f}x ({row.get('interval') or 'no interval'})"
    return f"{r:.2f}x (95% CI {low:.2f}x to {high:.2f}x)"


def _print(result: dict[str, Any]) -> None:
    from speclens.runs.compare_decide import decision_lines
    from speclens.runs.html import check_word

    if result.get("decision"):  # the answer first, the tables after
        for line in decision_lines(result["decision"]):
            out_console.print(escape(line), highlight=False, soft_wrap=True)
        out_console.print()
    for note in result.get("notes") or []:  # the odd run, before the tables
        out_console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    for item in result["inputs"]:
        gpus = f"{item['gpus']} GPU" + ("s" if item["gpus"] > 1 else "")
        published = ", aggregate-only" if item.get("aggregate_only") else ""
        out_console.print(
            f"{escape(item['label'])} = {escape(item['path'])} ({item['kind']}, model "
            f"{escape(item['model'])}, engine {escape(str(item['engine'] or 'unknown'))}, {gpus}"
            f"{published})"
        )
        host = _host(item.get("host"))
        if host:
            out_console.print(f"  host: {escape(host)}")
        for note in item.get("notes") or []:
            out_console.print(f"  note: {escape(note)}")
    for pair in result["pairs"]:
        a, b, ok = pair["a"], pair["b"], pair["comparable"]
        style = "bold green" if ok else "bold red"
        out_console.print(f"\n[{style}]{escape(a)} vs {escape(b)}: {escape(pair['label'])}[/]")
        for check in pair["checks"]:
            word = {"pass": "[green]ok  [/]", "fail": "[red]FAIL[/]", "stated": "[cyan]stated[/]",
                    "n/a": "[yellow]n/a [/]"}[check_word(check)]  # fmt: skip
            out_console.print(f"  {word} {check['name']}: {escape(check['detail'])}")
        tag = pair_tag(pair)
        for row in pair["deltas"]["matched_concurrency"]:
            load = (f"concurrency {row['concurrency']}" if row["concurrency"] is not None
                    else f"request rate {row['request_rate']:g}/s")  # fmt: skip
            out_console.print(
                f"  {tag}{load}: {row['figure']} {escape(b)}/{escape(a)} {escape(_ratio(row))}"
            )
        noise = pair["deltas"].get("noise_note")
        if noise:
            out_console.print(f"  note: {escape(noise)}")
        for row in [] if pair.get("speculation") else pair["deltas"]["matched_interactivity"]:
            out_console.print(f"  {escape(row['sentence'])}")  # an A/B reads its own below
        note = pair["deltas"].get("interactivity_note")
        if note:
            out_console.print(f"  interactivity: {escape(note)}")
        for i, line in enumerate(speculation_lines(pair)):
            out_console.print(f"{'  ' if i == 0 else '    '}{escape(line)}")
        for i, line in enumerate(fidelity_lines(pair)):
            indent = "  " if i == 0 else "    "  # the header, then one line a figure
            out_console.print(f"{indent}{tag}{escape(line)}")


def _host(host: dict[str, Any] | None) -> str | None:
    """The client machine's load as its run recorded it, in words."""
    if not host:
        return None
    load = host.get("load_average")
    text = f"load average {load[0]:g} (1 min)" if load else "load average unknown"
    if host.get("cpus"):
        text += f" on {host['cpus']} CPUs"
    if host.get("steal_percent") is not None:
        text += f", {host['steal_percent']:g}% of CPU time stolen since boot"
    return text


def pair_tag(pair: dict[str, Any]) -> str:
    """What starts each delta line of a pair: nothing when it is comparable (as such, as a
    speculation A/B or as a prediction), else why its deltas are no speed-up."""
    if pair["comparable"]:
        return ""
    return "UNCHECKED: " if pair.get("verdict") == "published figures only" else "NOT COMPARABLE: "


def speculation_lines(pair: dict[str, Any]) -> list[str]:
    """A speculation A/B's reading: InferenceX's sentence, the table it rests on, and the TPOT
    speedup at each concurrency; none for any other pair."""
    ab = pair.get("speculation")
    if not ab:
        return []
    from speclens.runs.compare_deltas import NO_INTERVAL  # scipy, only where a pair needs it

    head = ab["headline"]
    lines = [head["sentence"] + f" ({NO_INTERVAL})" if head else
             f"speculation A/B: {ab.get('note') or 'no reading'}"]  # fmt: skip
    lines.append(f"basis: {ab['basis']}" + (f"; {ab['note']}" if ab.get("note") and head else ""))
    if ab["table"] and not ab["basis"].startswith("same concurrency"):
        lines.append(f"tok/s/user | {ab['off']} tok/s/GPU | {ab['on']} tok/s/GPU | delta")
        lines += [f"{r['tokens_per_s_per_user']:.1f} | {r['off_tok_s_gpu']:,.1f} | "
                  f"{r['on_tok_s_gpu']:,.1f} | {r['delta_pct']:+.1f}%" for r in ab["table"]]  # fmt: skip
    lines += [r["sentence"] + f" (median TPOT {r['off_tpot_ms']:.2f} ms off, "
              f"{r['on_tpot_ms']:.2f} ms on)" for r in ab["speedup"]]  # fmt: skip
    return lines


def fidelity_lines(pair: dict[str, Any]) -> list[str]:
    """The pair's fidelity block (B's per-request error against A, the observed run), one line
    a figure; none when compare made none (a sweep, or too few requests in common)."""
    fid = pair.get("fidelity")
    if not fid:
        return []
    if fid.get("kind") == "aggregate":
        return prediction_lines(fid)
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


#: The figures of a prediction's error table, as the console names them.
_PREDICTED = {"tpot_p50_ms": "median TPOT ms", "ttft_p50_ms": "median TTFT ms",
              "total_tokens_per_s_per_gpu": "total tok/s/GPU"}  # fmt: skip


def prediction_lines(fid: dict[str, Any]) -> list[str]:
    """A prediction against the measurement: per point predicted, measured and the signed
    error (predicted / measured - 1) of each figure, then each figure's median |error|."""
    lines = [f"prediction {fid['predicted']} against measurement {fid['measured']}, point by "
             "point: predicted / measured (error = predicted / measured - 1)"]  # fmt: skip
    for point in fid["points"]:
        load = (f"concurrency {point['concurrency']}" if point["concurrency"] is not None
                else f"request rate {point['request_rate']:g}/s")  # fmt: skip
        parts = []
        for name, title in _PREDICTED.items():
            e = point["figures"][name]
            shown = "/".join(
                "-" if v is None else f"{v:,.2f}" for v in (e["predicted"], e["measured"])
            )
            parts.append(f"{title} {shown} ({_pct(e['error'], '+')})")
        lines.append(f"{load}: " + "; ".join(parts))
    lines.append("median |error| over the points: " + "; ".join(
        f"{title} {_pct(fid['median_abs_error'][name])}" for name, title in _PREDICTED.items()))  # fmt: skip
    return lines


def _pct(value: float | None, sign: str = "") -> str:
    """A fraction as a percentage; "unknown" for an error too large for a float (null, or one
    whose percentage is past the largest float)."""
    if value is None or not math.isfinite(value * 100):
        return "unknown"
    return f"{value:{sign}.1%}"
