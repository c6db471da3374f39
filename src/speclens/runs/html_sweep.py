"""report.html for a sweep, top-down: its identity, what went wrong, the decision of
``--at-interactivity`` when there is one, each setting's peak, the plots (one line per engine,
K and AL), then the figures per point with their intervals and the points. Its one throughput
is output tokens/s: of the whole server, or per GPU where every point states its GPUs."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from speclens.runs.html import (
    MAX_TABLE_ROWS,
    REPORT_NAME,
    Fields,
    Page,
    ReportError,
    esc,
    expect_field,
    expect_schema,
    plot,
    read_json,
    write_page,
)
from speclens.runs.html_aggregate import AGGREGATE_LINE
from speclens.runs.rundir import is_number

#: A sweep point's figures (runs/points.py), as table columns: (name, title, digits).
POINT_FIGURES = (
    ("output_tokens_per_s", "output tok/s", 1),
    ("requests_per_s", "req/s", 2),
    ("tokens_per_s_per_user", "tok/s/user", 1),
    ("ttft_ms", "TTFT ms", 1),
    ("tpot_ms", "TPOT ms", 2),
    ("itl_ms", "ITL ms", 2),
    ("e2e_ms", "E2E ms", 1),
    ("realized_al", "realized AL", 4),
)
_SETTINGS = ("concurrency", "request_rate", "num_speculative_tokens", "acceptance_length")
_SAFE_DIR = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*\Z")


#: Where a sweep's plots would be when they were left out (an import draws none: matplotlib is
#: most of an import's time, and ``speclens report`` draws them when a page is wanted).
PLOTS_NOT_DRAWN = "not drawn when this sweep was written: run `speclens report` on its directory"


def write_sweep_report(
    sweep_dir: Path, decision: Mapping[str, Any] | None = None, plots: bool = True
) -> Path:
    """``sweep_dir/report.html`` from ``sweep_dir/sweep.json``; returns its path. ``decision``
    (``speclens sim --at-interactivity``, as decision.json holds it) goes at the page's top;
    ``plots`` false leaves the plots out, saying how to draw them."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / "sweep.json"
    sweep = read_json(path)
    expect_schema(sweep, path, "speclens.sweep/1")
    expect_field(sweep, path, "points", list)
    return write_page(sweep_dir, sweep_page(sweep, sweep_dir, decision, plots))


def decision_section(page: Page, f: Fields) -> None:
    """The answer of ``--at-interactivity`` first: its line, then each choice's tok/s/GPU at the
    target interactivity (``data-field`` paths under ``decision.``): the Ks of ``sim``
    (decision.json's ``ks``) or the inputs of ``compare`` (compare.json's ``choices``, each
    with its 95% interval)."""
    page.heading("Decision")
    page.add(f'<p class="decision"><strong>{f.text("decision", "headline")}</strong></p>')
    compared = isinstance(f.get("decision", "choices"), list)
    key = "choices" if compared else "ks"
    rows, intervals = [], False
    for i, e in f.rows("decision", key):
        d = ("decision", key, i)
        k = e.get("num_spec_tokens") if isinstance(e, dict) else None
        reason = f.get(*d, "reason")
        value = f.num(*d, "tok_s_gpu", digits=0) if reason is None else esc(str(reason))
        ratio = f.num(*d, "ratio_to_best", digits=3)
        if compared:
            bounds = _between(f, d, "low", "high", 0), _between(f, d, "ratio_low", "ratio_high", 3)
            intervals = intervals or any(bounds)
            value, ratio = value + bounds[0], ratio + bounds[1]
            rows.append([f.text(*d, "label"), f.num(*d, "num_spec_tokens"), value, ratio])
        else:
            value += _between(f, d, "expected_low", "expected_high", 0)
            rows.append([f.num(*d, "num_spec_tokens") if k else "no speculation",
                         f.num(*d, "acceptance_length", digits=2), value, ratio])  # fmt: skip
    target = f.get("decision", "tok_s_user")
    figure = str(f.get("decision", "figure") or "output tok/s/GPU")
    ci = " (95% CI)" if intervals else ""
    page.table(
        f"at {target:g} tok/s/user" if is_number(target) else "at the target interactivity",
        ["input", "K", f"{figure}{ci}", f"ratio to best{ci}"] if compared
        else ["K", "AL", figure, "ratio to best"],
        rows, empty="nothing was compared",
    )  # fmt: skip
    if f.get("decision", "lead"):
        page.note(f.text("decision", "lead"))
    first = f.text("decision", "figure") if compared else f"{f.num('decision', 'gpus')} GPUs"
    page.note(f"{first}; {f.text('decision', 'interval')}")
    if isinstance(f.get("decision", "trust", "line"), str):
        page.add(f'<p class="trust">{f.text("decision", "trust", "line")}; in brackets, each '
                 "figure's range: figure / (1 + e) to figure x (1 + e), e its throughput "
                 "error</p>")  # fmt: skip


def _between(f: Fields, d: tuple[str | int, ...], low: str, high: str, digits: int) -> str:
    """`` (low to high)`` as a note, or nothing when either bound is missing."""
    if not (is_number(f.get(*d, low)) and is_number(f.get(*d, high))):
        return ""
    return (f' <span class="note">({f.num(*d, low, digits=digits)} to '
            f"{f.num(*d, high, digits=digits)})</span>")  # fmt: skip


def _settings_text(f: Fields, *parts: str | int) -> str:
    shown = [
        f"{name.replace('_', ' ')} {f.num(*parts, name)}"
        for name in _SETTINGS
        if is_number(f.get(*parts, name))
    ]
    return ", ".join(shown) or "-"


def sweep_page(
    sweep: dict[str, Any],
    sweep_dir: Path,
    decision: Mapping[str, Any] | None = None,
    plots: bool = True,
) -> Page:
    """Top-down: what was swept, the decision (``--at-interactivity``) or what went wrong,
    each setting's peak, the plots, then every point's figures and the points themselves."""
    f = Fields(sweep)
    page = Page(f"speclens sweep: {f.get('kind') or '?'} axes", "sweep.json")
    points = [p for _, p in f.rows("points") if isinstance(p, dict)]
    summaries = _point_summaries(points, sweep_dir)
    page.add('<p class="identity">' + " · ".join(
        f"{name} <strong>{value}</strong>" for name, value in _identity(f, summaries)) + "</p>")  # fmt: skip
    bad = [p for p in points if p.get("status") != "ok"]
    if bad:
        page.banner("fail", f"{len(bad)} of {len(points)} points did not finish ok: "
                    + esc(", ".join(f"{p.get('id')} ({p.get('status')})" for p in bad[:20])))  # fmt: skip
    published = sum(s.get("aggregate_only") is True for s in summaries)
    if published:
        page.banner("warn", f"{published} of {len(points)} points are {esc(AGGREGATE_LINE)}: "
                    "their figures have no interval (n/a: aggregate-only)")  # fmt: skip
    if decision is not None:
        decision_section(page, Fields({"decision": decision}))
    if decision is None or not isinstance((decision.get("trust") or {}).get("line"), str):
        for line in dict.fromkeys(s["trust"] for s in summaries if s.get("trust")):
            page.add(f'<p class="trust">{esc(line)}</p>')
    gpus = _gpus(summaries)
    _peak_table(page, f, gpus)
    page.heading("Plots")
    if plots:
        page.plots(_sweep_plots(f, gpus))
    else:
        page.note(esc(PLOTS_NOT_DRAWN))
    page.heading("Every point")
    _stats_table(page, f, gpus)
    axes = "; ".join(f"{esc(k)}: {f.text('axes', k)}" for k, _ in f.items("axes"))
    page.table("Sweep", None, [("kind", f.text("kind")), ("rounds", f.num("rounds")),
                               ("axes", axes or "-")])  # fmt: skip
    _points_table(page, f, sweep_dir)
    return page


def _gpus(summaries: Sequence[Mapping[str, Any]]) -> int | None:
    """The GPUs behind the sweep's points, when every point's run that states its settings
    states the same count (points with no run have no figures)."""
    stated = {_plain(s["settings"].get("gpus")) for s in summaries}
    one = next(iter(stated)) if len(stated) == 1 else None
    return one if isinstance(one, int) and not isinstance(one, bool) and one > 0 else None


def _plain(value: Any) -> Any:
    """A JSON value as a key: a string or number as it is, anything else its short repr."""
    return value if value is None or isinstance(value, str | int | float) else repr(value)[:40]


def output_title(gpus: int | None, per_gpu: bool = False) -> str:
    """The sweep page's one throughput, named: output tokens (never input + output) per second,
    of the whole server or per GPU."""
    if per_gpu and gpus:
        return "output tok/s/GPU"
    return f"output tok/s ({gpus} GPUs)" if gpus else "output tok/s (whole server)"


def _point_summaries(points: Sequence[Mapping[str, Any]], sweep_dir: Path) -> list[dict[str, Any]]:
    """The summary.json of each point that has one readable (the first ``MAX_TABLE_ROWS``),
    kept in the fields the page reads: settings, the server's identity, aggregate-only."""
    out = []
    for point in points[:MAX_TABLE_ROWS]:
        where = point.get("dir")
        if not (isinstance(where, str) and _SAFE_DIR.match(where) and ".." not in where.split("/")):
            continue
        try:
            summary = read_json(sweep_dir / where / "summary.json")
        except ReportError:
            continue
        settings, server = summary.get("settings"), summary.get("server")
        out.append({
            "settings": {k: settings.get(k) for k in _IDENTITY_SETTINGS}
            if isinstance(settings, dict) else {},
            "server": {k: server.get(k) for k in ("engine", "version", "hardware", "model",
                                                  "acceptance")}
            if isinstance(server, dict) else {},
            "aggregate_only": summary.get("aggregate_only"),
            "trust": _trust_line(summary),
        })  # fmt: skip
    return out


def _trust_line(summary: Mapping[str, Any]) -> str | None:
    """A predicted run's statement of how far to trust it (``provenance.trust.line``)."""
    provenance = summary.get("provenance")
    said = provenance.get("trust") if isinstance(provenance, dict) else None
    line = said.get("line") if isinstance(said, dict) else None
    return line if isinstance(line, str) else None


_IDENTITY_SETTINGS = ("model", "hardware", "engine", "num_spec_tokens", "method", "gpus")


def _identity(f: Fields, summaries: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The sweep's model, chip, engine and K, as its points' runs state them (each value once;
    "not recorded" where no run states it)."""

    def values(*getters: Callable[[Mapping[str, Any]], Any]) -> str:
        found: list[str] = []
        for summary in summaries:
            for get in getters:
                value = get(summary)
                if isinstance(value, str | int) and not isinstance(value, bool) and value != "":
                    if str(value) not in found:
                        found.append(str(value))
                    break
        return esc(", ".join(found[:16])) if found else "not recorded"

    def acceptance(s: Mapping[str, Any]) -> Mapping[str, Any]:
        a = s["server"].get("acceptance")
        return a if isinstance(a, dict) else {}

    ks = [k for k in f.get("axes", "num_speculative_tokens") or [] if isinstance(k, int)]
    k_text = (esc(", ".join(map(str, ks))) if ks else
              values(lambda s: s["settings"].get("num_spec_tokens"),
                     lambda s: acceptance(s).get("num_speculative_tokens")))  # fmt: skip
    engine = values(
        lambda s: " ".join(str(s["server"][k]) for k in ("engine", "version")
                           if isinstance(s["server"].get(k), str)) or None,
        lambda s: s["settings"].get("engine"),
    )  # fmt: skip
    engines = [str(e) for e in f.get("axes", "engine") or [] if isinstance(e, str)]
    if engines:
        engine = esc(", ".join(engines)) + (f" ({engine})" if engine != "not recorded" else "")
    method = values(lambda s: acceptance(s).get("method"), lambda s: s["settings"].get("method"))
    return [
        ("model", values(lambda s: s["settings"].get("model"), lambda s: s["server"].get("model"))),
        ("chip", values(lambda s: s["settings"].get("hardware"),
                        lambda s: s["server"].get("hardware"))),
        ("engine", engine),
        ("K", k_text + (f" ({method})" if method != "not recorded" else "")),
    ]  # fmt: skip


def _stats_table(page: Page, f: Fields, gpus: int | None = None) -> None:
    rows = []
    for i, _ in f.rows("stats"):
        s = ("stats", i)
        rows.append((f.text(*s, "engine"), _settings_text(f, *s, "settings"), f.num(*s, "rounds_ok"),
                     *(f.interval(*s, "figures", name, digits=d) for name, _, d in POINT_FIGURES)))  # fmt: skip
    methods = sorted({
        str(f.get("stats", i, "figures", name, "method"))
        for i, _ in f.rows("stats") for name, _, _ in POINT_FIGURES
        if f.get("stats", i, "figures", name, "method")
    })  # fmt: skip
    titles = [output_title(gpus) if name == "output_tokens_per_s" else title
              for name, title, _ in POINT_FIGURES]  # fmt: skip
    page.table("Figures per point (mean, 95% interval)",
               ["engine", "settings", "rounds ok", *titles], rows,
               empty="no point has finished yet")  # fmt: skip
    page.note(
        "interval methods: " + esc(", ".join(methods) or "-") + " (t: Student t across "
        "rounds; bootstrap: one round, resampled over its requests; the realized AL uses "
        "the ratio estimator's standard error; none: too few values, or an aggregate-only "
        "point's published figure)"
    )


def _points_table(page: Page, f: Fields, sweep_dir: Path) -> None:
    rows = []
    for i, point in f.rows("points"):
        p = ("points", i)
        where = point.get("dir") if isinstance(point, dict) else None
        report = (
            f'<a href="{esc(where)}/{REPORT_NAME}">{esc(where)}</a>'
            if isinstance(where, str) and _SAFE_DIR.match(where) and ".." not in where.split("/")
            and (sweep_dir / where / REPORT_NAME).is_file()
            else f.text(*p, "dir")
        )  # fmt: skip
        status = f.get(*p, "status")
        cls = "ok" if status == "ok" else "bad"
        rows.append((f.text(*p, "id"), f.text(*p, "engine"), _settings_text(f, *p, "settings"),
                     f.num(*p, "round"), f'<span class="{cls}">{esc(status)}</span>',
                     f.num(*p, "exit_code"), report, f.text(*p, "error")))  # fmt: skip
    page.table("Points", ["id", "engine", "settings", "round", "status", "exit", "run", "error"],
               rows, empty="the sweep has run no point yet")  # fmt: skip


def _bounds(f: Fields, *parts: str | int) -> tuple[float, float]:
    low, high = f.get(*parts, "low"), f.get(*parts, "high")
    return (
        float(low) if is_number(low) else math.nan,
        float(high) if is_number(high) else math.nan,
    )


def _setting(f: Fields, i: int) -> tuple[Any, Any, Any]:
    """A stats entry's (engine, K, AL): what one line of a sweep's plot holds fixed."""
    return (
        _plain(f.get("stats", i, "engine")),
        _plain(f.get("stats", i, "settings", "num_speculative_tokens")),
        _plain(f.get("stats", i, "settings", "acceptance_length")),
    )


def settings_lines(f: Fields, label: str = "") -> dict[str, list[int]]:
    """The stats entries per line: one line per engine, K and AL, named by ``label``, the engine,
    and K and AL where the sweep has more than one of them ("sweep" when nothing names it)."""
    keys = {i: _setting(f, i) for i, _ in f.rows("stats")}
    varies = [len({key[n] for key in keys.values()}) > 1 for n in range(3)]
    lines: dict[str, list[int]] = {}
    for i, (engine, k, al) in keys.items():
        parts = [label, engine if engine else ""]
        if varies[1]:
            parts.append(f"K {k}" if k is not None else "K not set")
        if varies[2]:
            parts.append(f"AL {al:g}" if is_number(al) else "AL not set")
        name = " ".join(str(part) for part in parts if part) or "sweep"
        lines.setdefault(name, []).append(i)
    return lines


def stats_series(
    f: Fields, x_name: str, y_name: str, label: str = "", scale: float = 1.0
) -> list[Any]:
    """One series a line (``settings_lines``): the stats' (x, y) means with their intervals
    (y divided by ``scale``)."""
    from speclens.runs.html_plots import Series

    out = []
    for name, entries in settings_lines(f, label).items():
        x_err: list[tuple[float, float]] = []
        y_err: list[tuple[float, float]] = []
        s = Series(name, [], [], x_err, y_err)
        for i in entries:
            x, y = (
                f.get("stats", i, "figures", x_name, "mean"),
                f.get("stats", i, "figures", y_name, "mean"),
            )
            if not (is_number(x) and is_number(y)):
                continue
            lo, hi = _bounds(f, "stats", i, "figures", y_name)
            s.x.append(float(x))
            s.y.append(float(y) / scale)
            x_err.append(_bounds(f, "stats", i, "figures", x_name))
            y_err.append((lo / scale, hi / scale))
        if s.x:
            out.append(s)
    return out  # fmt: skip


def _peak_table(page: Page, f: Fields, gpus: int | None) -> None:
    """Per line of the plots, its point of the most output throughput: the load it ran at, the
    throughput, the interactivity and the realized AL there."""
    rows = []
    for name, entries in settings_lines(f).items():
        means = [(f.get("stats", i, "figures", "output_tokens_per_s", "mean"), i) for i in entries]
        found = [(m, i) for m, i in means if is_number(m)]
        if not found:
            continue
        i = max(found)[1]
        s = ("stats", i)
        load = ", ".join(
            f"{key.replace('_', ' ')} {f.num(*s, 'settings', key)}"
            for key in ("concurrency", "request_rate") if is_number(f.get(*s, "settings", key))
        ) or "-"  # fmt: skip
        rows.append((esc(name), load,
                     *(f.interval(*s, "figures", key, digits=d) for key, d in
                       (("output_tokens_per_s", 1), ("tokens_per_s_per_user", 1),
                        ("realized_al", 4)))))  # fmt: skip
    page.table("Peak output throughput per setting (mean, 95% interval)",
               ["setting", "load", output_title(gpus), "tok/s/user", "realized AL"], rows,
               empty="no point has finished yet")  # fmt: skip


def _sweep_plots(f: Fields, gpus: int | None = None) -> list[str]:
    from speclens.runs import html_plots as hp

    svgs = []
    pareto = stats_series(f, "tokens_per_s_per_user", "output_tokens_per_s", scale=gpus or 1.0)
    if pareto:
        svgs.append(plot("Pareto curve", hp.curve_plot, pareto, "tok/s/user",
                         output_title(gpus, per_gpu=True),
                         "Output throughput against interactivity" + hp.CI_TITLE, "pareto"))  # fmt: skip
    al = stats_series(f, "tpot_ms", "realized_al")
    if al:
        svgs.append(plot("AL against TPOT", hp.curve_plot, al, "TPOT (ms)", "realized AL",
                         "Realized AL against TPOT per point" + hp.CI_TITLE, "sweep-al"))  # fmt: skip
    return svgs
