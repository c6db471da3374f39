"""report.html for a compare: the decision, each pair's checks, deltas, speculation A/B and
fidelity, and the inputs' Pareto curves. Throughput is compare.json's ``metric`` (total or
output tokens/s) on every table, sentence and plot of the page, each naming it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speclens.runs.html import (
    Fields,
    Page,
    ReportError,
    check_word,
    esc,
    expect_field,
    expect_schema,
    plot,
    read_json,
    write_page,
)
from speclens.runs.html_aggregate import AGGREGATE_LINE
from speclens.runs.html_sweep import stats_series
from speclens.runs.rundir import is_number


def write_compare_report(out_dir: Path, compare_json: Mapping[str, Any] | Path) -> Path:
    """``out_dir/report.html`` from a compare object (or the path of compare.json)."""
    out_dir = Path(out_dir)
    if isinstance(compare_json, Path):
        source = compare_json
        data = read_json(compare_json)
    else:
        source, data = out_dir / "compare.json", dict(compare_json)
    expect_schema(data, source, "speclens.compare/1")
    expect_field(data, source, "pairs", list)
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_page(out_dir, compare_page(data, out_dir))


def compare_page(data: dict[str, Any], out_dir: Path) -> Page:
    f = Fields(data)
    labels = [str(f.get("inputs", i, "label")) for i, _ in f.rows("inputs")]
    page = Page("speclens compare: " + " vs ".join(labels[:8]), "compare.json")
    if isinstance(f.get("decision"), dict):  # the answer first, the tables after
        _decision_section(page, f)
    for j, _ in f.rows("notes"):  # the odd run flagged, with the answer
        page.banner("warn", "note: " + f.text("notes", j))
    not_comparable = [i for i, _ in f.rows("pairs") if f.get("pairs", i, "comparable") is not True]
    if not_comparable:
        page.banner("fail", f"{len(not_comparable)} of {len(f.get('pairs'))} pairs are not "
                    "comparable (or not checked): their deltas are not speed-ups")  # fmt: skip
    page.table("Inputs", ["label", "kind", "model", "engine", "GPUs", "path"], [
        (f.text("inputs", i, "label"), f.text("inputs", i, "kind"), f.text("inputs", i, "model"),
         f.text("inputs", i, "engine"), f.num("inputs", i, "gpus"), f.text("inputs", i, "path"))
        for i, _ in f.rows("inputs")
    ], empty="no input")  # fmt: skip
    for i, _ in f.rows("pairs"):
        _pair_section(page, f, i)
    page.heading("Plots")
    page.plots(_compare_plots(f, out_dir))
    return page


def _unit(f: Fields) -> str:
    """The throughput as the page names it: "total tok/s/GPU", "output tok/s/GPU" (a
    compare.json written before ``--metric``: "tok/s/GPU")."""
    metric = f.get("metric")
    return f"{metric} tok/s/GPU" if metric in ("total", "output") else "tok/s/GPU"


def _decision_section(page: Page, f: Fields) -> None:
    """The answer of ``--at-interactivity`` first: its line (a warning, not a pass, where the
    lead is not resolved), the lead, then each input's figure at the target with what kind it
    is (measured with its 95% interval, aggregate-only, predicted) and its ratio to the best
    (``data-field`` paths under ``decision.``)."""
    page.heading("Decision")
    resolved = f.get("decision", "resolved")
    kind = "pass" if resolved is True else "warn" if resolved is False else "note"
    page.add(f'<p class="decision banner {kind}"><strong>{f.text("decision", "headline")}'
             "</strong></p>")  # fmt: skip
    rows = []
    for i, _ in f.rows("decision", "choices"):
        d = ("decision", "choices", i)
        reason = f.get(*d, "reason")
        value = f.num(*d, "tok_s_gpu", digits=0) if reason is None else esc(str(reason))
        value += _between(f, d, "low", "high", 0)
        ratio = f.num(*d, "ratio_to_best", digits=3) + _between(f, d, "ratio_low", "ratio_high", 3)
        rounds = f.get(*d, "rounds")
        what = f.text(*d, "kind") if f.get(*d, "kind") else "-"
        if is_number(rounds):
            what += f" ({int(rounds)} round{'s' if rounds != 1 else ''})"
        rows.append([f.text(*d, "label"), f.num(*d, "num_spec_tokens"), what, value, ratio])
    target = f.get("decision", "tok_s_user")
    page.table(
        f"at {target:g} tok/s/user" if is_number(target) else "at the target interactivity",
        ["input", "K", "figures", f"{_unit(f)} (95% CI)", "ratio to best (95% CI)"],
        rows, empty="nothing was compared",
    )  # fmt: skip
    if f.get("decision", "lead"):
        page.note(f.text("decision", "lead"))
    page.note(f"{f.text('decision', 'figure')}; {f.text('decision', 'interval')}")


def _between(f: Fields, d: tuple[str | int, ...], low: str, high: str, digits: int) -> str:
    """`` (low to high)`` as a note, or nothing when either bound is missing."""
    if not (is_number(f.get(*d, low)) and is_number(f.get(*d, high))):
        return ""
    return (f' <span class="note">({f.num(*d, low, digits=digits)} to '
            f"{f.num(*d, high, digits=digits)})</span>")  # fmt: skip


def _pair_section(page: Page, f: Fields, i: int) -> None:
    p = ("pairs", i)
    a, b = str(f.get(*p, "a")), str(f.get(*p, "b"))
    page.heading(f"{a} against {b}")
    ok = f.get(*p, "comparable") is True
    label = f.get(*p, "label") or ("comparable" if ok else "not comparable")
    page.banner("pass" if ok else "fail", esc(label))
    results = {"pass": '<span class="ok">pass</span>', "fail": '<span class="bad">fail</span>',
               "stated": '<span class="note">stated</span>', "n/a": "n/a: not run"}  # fmt: skip
    page.table("Comparability checks", ["check", "result", "evidence"], [
        (f.text(*p, "checks", j, "name"),
         results[check_word(check if isinstance(check, dict) else {})],
         f.text(*p, "checks", j, "detail"))
        for j, check in f.rows(*p, "checks")
    ], empty="no check ran")  # fmt: skip
    tag = "" if ok else f" ({label}: not a speed-up)"
    _speculation_table(page, f, i)
    mc = (*p, "deltas", "matched_concurrency")
    page.table("At matched concurrency" + tag, ["concurrency", "figure", a, b, f"{b} / {a}"], [
        (f.num(*mc, j, "concurrency"), f.text(*mc, j, "figure"), f.interval(*mc, j, "a"),
         f.interval(*mc, j, "b"),
         f"{f.num(*mc, j, 'ratio', digits=3)} <span class=\"note\">"
         + (f"({f.text(*mc, j, 'interval')})" if f.get(*mc, j, "interval") else
            f"({f.num(*mc, j, 'ratio_low', digits=3)} to {f.num(*mc, j, 'ratio_high', digits=3)})")
         + "</span>")
        for j, _ in f.rows(*mc)
    ], empty=f"no load that both {a} and {b} ran")  # fmt: skip
    mi = (*p, "deltas", "matched_interactivity")
    # an aggregate-only pair (some check did not run) has no interval to show
    aggregate = any(f.get(*p, "checks", j, "ok") is None for j, _ in f.rows(*p, "checks"))
    page.table("At matched interactivity" + tag,
               ["tok/s/user", f"{a} {_unit(f)}", f"{b} {_unit(f)}", "delta %", "reading"], [
        (f.num(*mi, j, "tokens_per_s_per_user", digits=1), f.num(*mi, j, "a_tok_s_gpu", digits=1),
         f.num(*mi, j, "b_tok_s_gpu", digits=1),
         f"{f.num(*mi, j, 'delta_pct', digits=1)} <span class=\"note\">"
         + (f"({f.num(*mi, j, 'low_pct', digits=1)} to {f.num(*mi, j, 'high_pct', digits=1)})"
            if is_number(f.get(*mi, j, "low_pct")) or not aggregate else "(no interval)")
         + "</span>",
         f.text(*mi, j, "sentence") if ok or aggregate  # its sentence says it already
         else f"not comparable: {f.text(*mi, j, 'sentence')}")
        for j, _ in f.rows(*mi)
    ], empty=str(f.get(*p, "deltas", "interactivity_note") or "no interactivity both reach"))  # fmt: skip
    _fidelity_table(page, f, i)


def _fidelity_table(page: Page, f: Fields, i: int) -> None:
    """The pair's fidelity block as a table (what the console prints, as fractions of A's value
    so each shown number is the file's)."""
    fid = ("pairs", i, "fidelity")
    if not isinstance(f.get(*fid), dict):
        return
    if f.get(*fid, "kind") == "aggregate":
        _prediction_table(page, f, i)
        return
    a, b = f.get("pairs", i, "a"), f.get("pairs", i, "b")
    tag = "" if f.get("pairs", i, "comparable") is True else " (NOT COMPARABLE)"
    err = f"|{b} - {a}| / {a}"
    page.table(f"Fidelity of {b} against {a}, request by request" + tag,
               ["figure", "requests", f"median {err}", f"P90 {err}", "MAPE",
                f"bias ({b} - {a}) / {a}"], [
        (esc(name.upper()), f.num(*fid, "figures", name, "requests"),
         *(f.num(*fid, "figures", name, key, digits=4)
           for key in ("median_ape", "p90_ape", "mape", "bias")))
        for name, _ in f.items(*fid, "figures")
    ], empty="no figure was compared")  # fmt: skip
    page.note(f"{f.num(*fid, 'matched')} requests matched by index, {f.num(*fid, 'unmatched')} "
              f"left out; errors are fractions of {esc(a)}'s value (0.05 is 5%), bias the median signed "
              f"error. Throughput (output tokens/s) error ({esc(b)} - {esc(a)}) / {esc(a)}: "
              f"{f.num(*fid, 'throughput_error', digits=4)}.")  # fmt: skip


#: A prediction's figures against the measurement: (name, title, digits).
_PREDICTED = (("tpot_p50_ms", "median TPOT ms", 2), ("ttft_p50_ms", "median TTFT ms", 1),
              ("total_tokens_per_s_per_gpu", "total tok/s/GPU", 1))  # fmt: skip


def _prediction_table(page: Page, f: Fields, i: int) -> None:
    """A prediction against the measurement, point by point: predicted, measured and the
    signed error predicted / measured - 1 of each figure; each figure's median |error|."""
    fid = ("pairs", i, "fidelity")
    header = ["load"] + [f"{t} {w}" for _, t, _ in _PREDICTED
                         for w in ("predicted", "measured", "error")]  # fmt: skip
    rows = []
    for j, _ in f.rows(*fid, "points"):
        pt = (*fid, "points", j)
        load = (f"concurrency {f.num(*pt, 'concurrency')}" if f.get(*pt, "concurrency") is not None
                else f"{f.num(*pt, 'request_rate')} req/s")  # fmt: skip
        rows.append((load, *(f.num(*pt, "figures", name, w, digits=d if w != "error" else 4)
                             for name, _, d in _PREDICTED
                             for w in ("predicted", "measured", "error"))))  # fmt: skip
    page.table(f"Prediction {f.get(*fid, 'predicted')} against measurement "
               f"{f.get(*fid, 'measured')}", header, rows,
               empty="no load that both the prediction and the measurement ran")  # fmt: skip
    page.note("error: predicted / measured - 1, as a fraction (0.05 is 5%); median |error| "
              "over the points: " + ", ".join(
                  f"{esc(t)} {f.num(*fid, 'median_abs_error', name, digits=4)}"
                  for name, t, _ in _PREDICTED) + "; " + esc(AGGREGATE_LINE))  # fmt: skip


def _speculation_table(page: Page, f: Fields, i: int) -> None:
    """A speculation A/B: InferenceX's sentence, its table and the TPOT speedup per load."""
    ab = ("pairs", i, "speculation")
    if not isinstance(f.get(*ab), dict):
        return
    head = (*ab, "headline")
    if isinstance(f.get(*head), dict):
        delta = f.get(*head, "delta_pct")
        gain = is_number(delta) and delta > 0  # a loss (or no change) is never shown as a pass
        page.banner("pass" if gain else "warn", f"{f.text(*head, 'sentence')} <span class=\"note\">"
                    f"(at {f.num(*head, 'tokens_per_s_per_user', digits=1)} tok/s/user: "
                    f"{f.num(*head, 'off_tok_s_gpu', digits=1)} off, "
                    f"{f.num(*head, 'on_tok_s_gpu', digits=1)} on, "
                    f"{f.num(*head, 'delta_pct', digits=1)}%; no interval: aggregate-only)</span>")  # fmt: skip
    page.table(f"Speculation A/B: {f.get(*ab, 'off')} off, {f.get(*ab, 'on')} "
               f"{f.get(*ab, 'method')} ({f.get(*ab, 'basis')})",
               ["tok/s/user", f"off {_unit(f)}", f"on {_unit(f)}", "delta %", "reading"], [
        (f.num(*ab, "table", j, "tokens_per_s_per_user", digits=1),
         f.num(*ab, "table", j, "off_tok_s_gpu", digits=1),
         f.num(*ab, "table", j, "on_tok_s_gpu", digits=1),
         f.num(*ab, "table", j, "delta_pct", digits=1), f.text(*ab, "table", j, "sentence"))
        for j, _ in f.rows(*ab, "table")
    ], empty=str(f.get(*ab, "note") or "no interactivity both sides reach"))  # fmt: skip
    page.table("TPOT speedup (median TPOT off / on)",
               ["concurrency", "off TPOT ms", "on TPOT ms", "speedup", "reading"], [
        (f.num(*ab, "speedup", j, "concurrency"), f.num(*ab, "speedup", j, "off_tpot_ms", digits=2),
         f.num(*ab, "speedup", j, "on_tpot_ms", digits=2),
         f.num(*ab, "speedup", j, "speedup", digits=3), f.text(*ab, "speedup", j, "sentence"))
        for j, _ in f.rows(*ab, "speedup")
    ], empty="no concurrency at which both sides published a median TPOT")  # fmt: skip
    if f.get(*ab, "note"):
        page.note(f.text(*ab, "note"))


def _input_dir(raw: Any, out_dir: Path) -> Path | None:
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        return None
    path = Path(raw)
    for candidate in (path, out_dir / path) if not path.is_absolute() else (path,):
        if candidate.is_dir():
            return candidate
    return None


def input_series(f: Fields, i: int, out_dir: Path) -> list[Any]:
    """An input's points per GPU in the page's throughput: compare.json's ``inputs[].curve``;
    for a compare.json written before it, its sweep's stats (output tokens/s), or a run's
    single point."""
    from speclens.runs.html_plots import Series

    label = str(f.get("inputs", i, "label") or i)
    curve = f.get("inputs", i, "curve")
    if isinstance(curve, list):
        points = [c for _, c in f.rows("inputs", i, "curve")
                  if isinstance(c, dict) and is_number(c.get("tok_s_user"))
                  and is_number(c.get("tok_s_gpu"))]  # fmt: skip
        if not points:
            return []
        bounds = [(float(c["low"]), float(c["high"])) if is_number(c.get("low"))
                  and is_number(c.get("high")) else (math.nan, math.nan) for c in points]  # fmt: skip
        return [Series(label, [float(c["tok_s_user"]) for c in points],
                       [float(c["tok_s_gpu"]) for c in points], None, bounds,
                       line=len(points) > 1)]  # fmt: skip
    where = _input_dir(f.get("inputs", i, "path"), out_dir)
    if where is None:
        return []
    gpus = f.get("inputs", i, "gpus")
    gpus = float(gpus) if is_number(gpus) and gpus > 0 else 1.0
    try:
        if (where / "sweep.json").is_file():
            sweep = read_json(where / "sweep.json")
            select = f.get("inputs", i, "select")
            if isinstance(select, dict) and isinstance(sweep.get("stats"), list):
                sweep["stats"] = [s for s in sweep["stats"] if _selected(s, select)]
            return stats_series(Fields(sweep), "tokens_per_s_per_user", "output_tokens_per_s",
                                label, gpus)  # fmt: skip
        run = Fields(read_json(where / "summary.json"))
    except ReportError:
        return []
    tpot = run.get("figures", "latency_ms", "tpot", "mean")
    tput = run.get("figures", "throughput", "output_tokens_per_s")
    if not (is_number(tpot) and tpot > 0 and is_number(tput)):
        return []
    return [Series(label, [1000.0 / tpot], [tput / gpus], line=False)]


def _selected(stat: Any, select: Mapping[str, Any]) -> bool:
    """A sweep's stats entry is the choice a compared input selects (``compare SWEEP_DIR``):
    its engine and settings equal the selection's."""
    if not isinstance(stat, dict):
        return False
    settings = stat.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    return all(
        (stat.get("engine") or "") == (value or "") if key == "engine"
        else settings.get(key) == value
        for key, value in select.items()
    )  # fmt: skip


def _compare_plots(f: Fields, out_dir: Path) -> list[str]:
    from speclens.runs import html_plots as hp

    svgs = []
    series = [s for i, _ in f.rows("inputs") for s in input_series(f, i, out_dir)]
    metric = f.get("metric") if f.get("metric") in ("total", "output") else "output"
    words = ("total (input + output) tokens/s per GPU" if metric == "total"
             else "output tokens/s per GPU")  # fmt: skip
    if series:
        svgs.append(plot("Pareto curves", hp.curve_plot, series, "tokens/s per user", words,
                         f"{words[0].upper()}{words[1:]} against interactivity (95% CI)",
                         "compare-pareto"))  # fmt: skip
    for i, _ in f.rows("pairs"):
        mc = ("pairs", i, "deltas", "matched_concurrency")
        names = {str(f.get(*mc, j, "figure")) for j, _ in f.rows(*mc)}
        figure = next((n for n in (f"{metric}_tokens_per_s", f"{metric}_tokens_per_s_per_gpu")
                       if n in names), None)  # fmt: skip
        rows = [
            (f"c{f.get(*mc, j, 'concurrency')}", float(f.get(*mc, j, "ratio")),
             float(f.get(*mc, j, "ratio_low")) if is_number(f.get(*mc, j, "ratio_low")) else math.nan,
             float(f.get(*mc, j, "ratio_high")) if is_number(f.get(*mc, j, "ratio_high")) else math.nan)
            for j, _ in f.rows(*mc)
            if f.get(*mc, j, "figure") == figure and is_number(f.get(*mc, j, "ratio"))
        ]  # fmt: skip
        if rows:
            a, b = f.get("pairs", i, "a"), f.get("pairs", i, "b")
            title = f"{hp.label(str(b), 12)} / {hp.label(str(a), 12)} {metric} tok/s"
            if f.get("pairs", i, "comparable") is not True:
                title += " (not comparable)"
            svgs.append(plot(title, hp.ratio_plot, rows, title, f"ratio-{i}"))
    return svgs
