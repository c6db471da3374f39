"""report.html without a browser: written by every bench run, self-contained, its numbers equal
to the JSON beside it, a failed verification at the top; sweeps and compares; a 100k-request
run renders in bounded time and size; every table's layout (each number under its own header,
beside its own label) against the JSON, and the run page's AL interval against the records."""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from statistics import NormalDist
from typing import Any

import orjson
import pytest

from reportkit import ReportDirs, external_references, field_mismatches, make_dirs, scan
from speclens.runs.html import field_path, resolve_field
from speclens.runs.html_run import samples_from_file, write_run_report
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
    assert "Output throughput against interactivity" in _page(dirs.sweep)
    compare = _page(dirs.compare)
    assert 'class="banner pass"' in compare
    data = orjson.loads((dirs.compare / "compare.json").read_bytes())
    sentences = [m["sentence"] for m in data["pairs"][0]["deltas"]["matched_interactivity"]]
    assert sentences and all("B delivers" in s for s in sentences)
    assert all(html.escape(s, quote=False) in compare for s in sentences)
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


# ------------------------------------------------------------------------------ table layout
#
# Each shown number is checked against the JSON at its own data-field (above); these checks
# read the tables as a reader does: a number under the header (or beside the row label) that
# names it, each in-cell label beside its own number, and no number the page computed without
# a data-field except the run page's AL interval, which is checked against records.jsonl.


@dataclass
class _Table:
    caption: str
    header: list[str] | None
    rows: list[list[str]]  # each cell's text, a data-field number shown as {path}


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[_Table] = []
        self._rows: list[list[tuple[str, str]]] = []  # (tag, text) per cell
        self._caption: list[str] | None = None
        self._cell: list[str] | None = None
        self._spans: list[str | None] = []  # the open spans' data-fields
        self.caption = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._rows = []
        elif tag == "caption":
            self._caption = []
        elif tag == "tr":
            self._rows.append([])
        elif tag in ("th", "td"):
            self._cell = []
            self._rows[-1].append((tag, ""))
        elif tag == "span":
            self._spans.append(dict(attrs).get("data-field"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._spans:
            path = self._spans.pop()
            outer = all(p is None for p in self._spans)
            if path is not None and self._cell is not None and outer:
                self._cell.append("{" + path + "}")
        elif tag in ("th", "td") and self._cell is not None:
            kind, _ = self._rows[-1][-1]
            self._rows[-1][-1] = (kind, " ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "caption" and self._caption is not None:
            self.caption = " ".join("".join(self._caption).split())
            self._caption = None
        elif tag == "table":
            rows = self._rows
            headed = len(rows[0]) > 1 and all(kind == "th" for kind, _ in rows[0])
            self.tables.append(_Table(
                self.caption, [t for _, t in rows[0]] if headed else None,
                [[t for _, t in row] for row in (rows[1:] if headed else rows)],
            ))  # fmt: skip

    def handle_data(self, data: str) -> None:
        if self._caption is not None:
            self._caption.append(data)
        elif self._cell is not None and all(path is None for path in self._spans):
            self._cell.append(data)


def tables(page: str) -> dict[str, _Table]:
    parser = _Tables()
    parser.feed(page)
    return {t.caption: t for t in parser.tables}


class _Json:
    """How the page should show a JSON document's values, written apart from runs/html.py:
    ``n`` a number (``{path}``, or "-" when the file has none), ``t`` a text."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def get(self, *parts: str | int) -> Any:
        try:
            return resolve_field(self.data, field_path(*parts))
        except KeyError:
            return None

    def n(self, *parts: str | int) -> str:
        value = self.get(*parts)
        finite = isinstance(value, int | float) and not isinstance(value, bool)
        return "{" + field_path(*parts) + "}" if finite and math.isfinite(value) else "-"

    def t(self, *parts: str | int) -> str:
        value = self.get(*parts)
        if value is None or value == [] or value == {}:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, int | float):
            return self.n(*parts)
        return ", ".join(map(str, value)) if isinstance(value, list) else str(value)

    def interval(self, *parts: str | int) -> str:
        mean, low, high = (self.n(*parts, k) for k in ("mean", "low", "high"))
        return mean if "-" in (low, high) else f"{mean} ({low} to {high})"


def _al_interval(run_dir: Path) -> str:
    """The realized AL's 95% interval over the run's measured requests, from records.jsonl:
    AL = 1 + sum(a) / sum(s), with the ratio estimator's standard error
    sqrt(sum((a_i - r s_i)^2) / (n (n - 1))) / mean(s), r = sum(a) / sum(s)."""
    pairs = []
    for line in (run_dir / "records.jsonl").read_bytes().splitlines():
        row = orjson.loads(line)
        spec = row.get("spec_decode_acceptance") or {}
        if row["success"] and not row["warmup"] and (spec.get("num_spec_steps") or 0) > 0:
            pairs.append((spec["num_accepted_draft_tokens"], spec["num_spec_steps"]))
    n = len(pairs)
    total_a, total_s = sum(a for a, _ in pairs), sum(s for _, s in pairs)
    ratio = total_a / total_s
    se = math.sqrt(sum((a - ratio * s) ** 2 for a, s in pairs) / (n * (n - 1))) / (total_s / n)
    z = NormalDist().inv_cdf(0.975)
    return (
        f"(95% CI {1 + ratio - z * se:.4f} to {1 + ratio + z * se:.4f}, "
        f"ratio-estimator SE over {n} requests)"
    )


def run_layout(summary: dict[str, Any], al_interval: str) -> dict[str, _Table]:
    j = _Json(summary)
    s, a, v = ("settings",), ("figures", "acceptance"), ("verdict",)
    load = (
        f"concurrency {j.n(*s, 'concurrency')}" if j.get(*s, "request_rate") is None
        else f"{j.n(*s, 'request_rate')} req/s (burstiness {j.n(*s, 'burstiness')})"
    )  # fmt: skip
    acc = j.get("server", "acceptance")
    server_acceptance = "-"
    if isinstance(acc, dict):
        server_acceptance = (
            f"{j.t('server', 'acceptance', 'method')}, "
            f"K {j.n('server', 'acceptance', 'num_speculative_tokens')}"
        )
        server_acceptance += (
            f", forced AL {j.n('server', 'acceptance', 'acceptance_length')}"
            if acc.get("forced") else ", natural acceptance"
        )  # fmt: skip
    dataset = j.t(*s, "dataset")
    if j.get(*s, "dataset_path"):
        dataset += f" ({j.t(*s, 'dataset_path')})"
    out = {"Settings": _Table("Settings", None, [
        ["model", j.t(*s, "model")],
        ["server", j.t(*s, "urls") if j.get(*s, "urls") else j.t(*s, "url")],
        ["engine", f"{j.t('server', 'engine')} {j.t('server', 'version')} "
                   f"({j.t('server', 'executor')}, {j.t(*s, 'backend')} wire)"],
        ["load", load],
        ["requests", j.n(*s, "num_requests")],
        ["dataset", dataset],
        ["sampling", f"max tokens {j.n(*s, 'max_tokens')}, ignore-eos {j.t(*s, 'ignore_eos')}, "
                     f"temperature {j.n(*s, 'temperature')}"],
        ["server acceptance", server_acceptance],
    ])}  # fmt: skip
    r, tp = ("figures", "requests"), ("figures", "throughput")
    run_rows = [
        ["requests", f"{j.n(*r, 'completed')} completed, {j.n(*r, 'failed')} failed, "
                     f"{j.n(*r, 'warmup')} warm-up"],
        ["duration (s)", j.n("figures", "duration_s")],
        ["request throughput (req/s)", j.n(*tp, "requests_per_s")],
        ["output throughput (tok/s)", j.n(*tp, "output_tokens_per_s")],
        ["output tokens", j.n(*tp, "total_output_tokens")],
        ["prompt tokens", j.n(*tp, "total_prompt_tokens")],
    ]  # fmt: skip
    if isinstance(j.get("figures", "goodput"), dict):
        g = ("figures", "goodput")
        slo = ", ".join(f"{k} {j.n(*g, 'slo_ms', k)} ms" for k in j.get(*g, "slo_ms"))
        run_rows.append(["goodput (req/s)",
                         f"{j.n(*g, 'requests_per_s')} ({j.n(*g, 'fraction')} within {slo})"])  # fmt: skip
    out["Run"] = _Table("Run", None, run_rows)
    lat = ("figures", "latency_ms")
    out["At a glance"] = _Table("At a glance", None, [
        ["requests", f"{j.n(*r, 'completed')} completed, {j.n(*r, 'failed')} failed"],
        ["output throughput (tok/s)", j.n(*tp, "output_tokens_per_s")],
        ["token-weighted AL", f"{j.n(*a, 'token_weighted_al')} {al_interval}".strip()],
        ["TTFT p50 (ms)", j.n(*lat, "ttft", "p50")], ["TPOT p50 (ms)", j.n(*lat, "tpot", "p50")],
    ])  # fmt: skip
    keys = ["mean", "p50", "p90", "p99", "min", "max"]
    out["Latency (ms)"] = _Table("Latency (ms)", ["metric", *keys], [
        [name.upper(), *(j.n("figures", "latency_ms", name, k) for k in keys)]
        for name in j.get("figures", "latency_ms")
    ])  # fmt: skip
    rows = [
        ["requests with stats", f"{j.n(*a, 'requests_with_stats')} ({j.t(*a, 'adapters')})"],
        ["token-weighted AL", f"{j.n(*a, 'token_weighted_al')} {al_interval}".strip()],
    ]
    if j.get(*a, "counts_only_al"):
        rows.append(["counts only", j.t(*a, "counts_only_al")])
    if isinstance(j.get(*a, "per_request_al"), dict):
        rows.append(["per-request AL", ", ".join(
            f"{k} {j.n(*a, 'per_request_al', k)}" for k in ("mean", "p50", "p90", "p99"))])  # fmt: skip
    rows += [
        ["draft acceptance rate", j.t(*a, "draft_rate_refused") if j.get(*a, "draft_rate_refused")
                                  else j.n(*a, "draft_acceptance_rate")],
        ["accepted per verify step", j.n(*a, "accepted_per_step")],
        ["verify steps", j.n(*a, "verify_steps")],
    ]  # fmt: skip
    if j.get(*a, "draft_coverage_requests"):
        rows.append(["draft coverage", f"{j.n(*a, 'draft_coverage')} of {j.n(*a, 'decode_steps')} "
                     f"decode steps ({j.n(*a, 'draft_coverage_requests')} requests)"])  # fmt: skip
        rows.append(["tokens per decode step", j.n(*a, "tokens_per_decode_step")])
    hist = ", ".join(f"{k}: {j.n(*a, 'histogram', k)}" for k in j.get(*a, "histogram") or {})
    rows.append(["histogram (accepted: steps)", hist or "-"])
    rows.append(["zero-step requests", j.n(*a, "zero_step_requests")])
    for cat in j.get(*a, "al_by_category") or {}:
        rows.append([f"AL ({cat})", f"{j.n(*a, 'al_by_category', cat, 'al')} over "
                     f"{j.n(*a, 'al_by_category', cat, 'verify_steps')} steps"])  # fmt: skip
    if j.get(*a, "inconsistent_requests"):
        rows.append(["inconsistent requests", str(len(j.get(*a, "inconsistent_requests")))])
    c = ("server_check",)
    if j.get(*c, "available") and j.get(*c, "compared") is not False:
        state = "agree" if j.get(*c, "consistent") else j.t(*c, "flags")
        counters = f"{state} ({j.t(*c, 'source')}); server AL {j.n(*c, 'server_al')}"
    else:
        counters = j.t(*c, "note")
    rows.append(["server counters", counters])
    out["Acceptance"] = _Table("Acceptance", None, rows)
    leaves = [("requests",), ("verify_steps",), ("quantiles", "p10"), ("quantiles", "p50"),
              ("quantiles", "p90"), ("variance", "within"), ("variance", "between_observed"),
              ("variance", "noise"), ("variance", "between"), ("variance", "between_share")]  # fmt: skip
    spread_rows = []
    for name, at in [("all", (*a, "per_request"))] + [
        (cat, (*a, "al_by_category", cat, "per_request"))
        for cat in j.get(*a, "al_by_category") or {}
    ]:
        if isinstance(j.get(*at), dict):
            cells = [j.n(*at, *leaf) for leaf in leaves]
            if j.get(*at, "variance", "within") is None:
                cells[5] = f"unknown: {j.n(*at, 'without_histogram')} requests without a histogram"
            spread_rows.append([name, *cells])
    if spread_rows:
        caption = "AL between requests (each request weighted by its verify steps)"
        out[caption] = _Table(caption, [
            "category", "requests", "verify steps", "p10", "p50", "p90", "within",
            "between observed", "sampling noise", "between", "between share of the whole",
        ], spread_rows)  # fmt: skip
    derived = "Derived per engine (yes / some requests / no)"
    columns = [("draft_acceptance_rate", "draft rate"), ("al_per_request", "AL per request"),
               ("al_from_server_counters", "AL from counters"), ("histogram", "histogram"),
               ("per_step", "per-step"), ("decode_steps", "decode steps")]  # fmt: skip
    d = (*a, "derivable")
    if j.get(*d):
        out[derived] = _Table(derived, ["engine", "requests", *(t for _, t in columns)], [
            [engine, j.n(*d, engine, "requests"), *(j.t(*d, engine, k) for k, _ in columns)]
            for engine in j.get(*d)
        ])  # fmt: skip
    if isinstance(j.get(*v), dict):
        word = "PASS" if j.get(*v, "passed") else "FAIL"
        if j.get(*v, "inconclusive") and j.get(*v, "schedule_passed") is None:
            word = "INCONCLUSIVE"
        band = f"{j.n(*v, 'interval', 0)} to {j.n(*v, 'interval', 1)}"
        schedule = ", ".join(
            f"{k}: {j.n(*v, 'expected_distribution', k)}"
            for k in j.get(*v, "expected_distribution") or {}
        )
        out["Verification"] = _Table("Verification", None, [
            ["verdict", word], ["reason", j.t(*v, "reason")],
            ["expected AL", j.n(*v, "expected_acceptance_length")],
            ["realized AL", j.n(*v, "realized_acceptance_length")],
            ["accepted band", band if isinstance(j.get(*v, "interval"), list) else "-"],
            ["K", j.n(*v, "num_spec_tokens")], ["verify steps", j.n(*v, "verify_steps")],
            ["forced schedule (accepted: share)", schedule or "-"],
            ["observed / expected split",
             f"{j.n(*v, 'observed_split')} / {j.n(*v, 'expected_split')}"],
        ])  # fmt: skip
    return out


_SETTINGS = ("concurrency", "request_rate", "num_speculative_tokens", "acceptance_length")
_POINT_FIGURES = {
    "output tok/s (whole server)": "output_tokens_per_s", "req/s": "requests_per_s",
    "tok/s/user": "tokens_per_s_per_user", "TTFT ms": "ttft_ms", "TPOT ms": "tpot_ms",
    "ITL ms": "itl_ms", "E2E ms": "e2e_ms", "realized AL": "realized_al",
}  # fmt: skip


def _settings(j: _Json, *parts: str | int) -> str:
    shown = [f"{name.replace('_', ' ')} {j.n(*parts, name)}" for name in _SETTINGS
             if j.n(*parts, name) != "-"]  # fmt: skip
    return ", ".join(shown) or "-"


def sweep_layout(sweep: dict[str, Any]) -> dict[str, _Table]:
    """A load sweep of one setting (no engine, K or AL named): one line, "sweep", whose peak is
    its point of the most output tokens/s."""
    j = _Json(sweep)
    axes = "; ".join(f"{k}: {j.t('axes', k)}" for k in j.get("axes") or {})
    stats = "Figures per point (mean, 95% interval)"
    peak = max(range(len(sweep["stats"])),
               key=lambda i: sweep["stats"][i]["figures"]["output_tokens_per_s"]["mean"])  # fmt: skip
    f = ("stats", peak, "figures")
    caption = "Peak output throughput per setting (mean, 95% interval)"
    return {
        caption: _Table(caption, ["setting", "load", "output tok/s (whole server)", "tok/s/user",
                                  "realized AL"], [
            ["sweep", f"concurrency {j.n('stats', peak, 'settings', 'concurrency')}",
             *(j.interval(*f, k) for k in ("output_tokens_per_s", "tokens_per_s_per_user",
                                           "realized_al"))]]),
        "Sweep": _Table("Sweep", None, [
            ["kind", j.t("kind")], ["rounds", j.n("rounds")], ["axes", axes or "-"]]),
        stats: _Table(stats, ["engine", "settings", "rounds ok", *_POINT_FIGURES], [
            [j.t("stats", i, "engine"), _settings(j, "stats", i, "settings"),
             j.n("stats", i, "rounds_ok"),
             *(j.interval("stats", i, "figures", name) for name in _POINT_FIGURES.values())]
            for i in range(len(sweep["stats"]))
        ]),
        "Points": _Table(
            "Points", ["id", "engine", "settings", "round", "status", "exit", "run", "error"], [
            [j.t("points", i, "id"), j.t("points", i, "engine"),
             _settings(j, "points", i, "settings"), j.n("points", i, "round"),
             j.t("points", i, "status"), j.n("points", i, "exit_code"), j.t("points", i, "dir"),
             j.t("points", i, "error")]
            for i in range(len(sweep["points"]))
        ]),
    }  # fmt: skip


def compare_layout(data: dict[str, Any]) -> dict[str, _Table]:
    j = _Json(data)
    out = {"Inputs": _Table("Inputs", ["label", "kind", "model", "engine", "GPUs", "path"], [
        [*(j.t("inputs", i, k) for k in ("label", "kind", "model", "engine")),
         j.n("inputs", i, "gpus"), j.t("inputs", i, "path")]
        for i in range(len(data["inputs"]))
    ])}  # fmt: skip
    for i, pair in enumerate(data["pairs"]):
        p = ("pairs", i)
        ok = pair.get("comparable") is True
        label = pair.get("label") or ("comparable" if ok else "not comparable")
        tag = "" if ok else f" ({label}: not a speed-up)"
        out["Comparability checks"] = _Table("Comparability checks", ["check", "result", "evidence"], [
            [j.t(*p, "checks", k, "name"), "pass" if j.get(*p, "checks", k, "ok") else "fail",
             j.t(*p, "checks", k, "detail")]
            for k in range(len(pair["checks"]))
        ])  # fmt: skip
        mc = (*p, "deltas", "matched_concurrency")
        caption = "At matched concurrency" + tag
        out[caption] = _Table(caption, ["concurrency", "figure", "A", "B", "B / A"], [
            [j.n(*mc, k, "concurrency"), j.t(*mc, k, "figure"), j.interval(*mc, k, "a"),
             j.interval(*mc, k, "b"),
             f"{j.n(*mc, k, 'ratio')} ({j.n(*mc, k, 'ratio_low')} to {j.n(*mc, k, 'ratio_high')})"]
            for k in range(len(j.get(*mc)))
        ])  # fmt: skip
        mi = (*p, "deltas", "matched_interactivity")
        caption = "At matched interactivity" + tag
        metric = data.get("metric")
        unit = f"{metric} tok/s/GPU" if metric in ("total", "output") else "tok/s/GPU"
        out[caption] = _Table(
            caption, ["tok/s/user", f"A {unit}", f"B {unit}", "delta %", "reading"], [
            [j.n(*mi, k, "tokens_per_s_per_user"), j.n(*mi, k, "a_tok_s_gpu"),
             j.n(*mi, k, "b_tok_s_gpu"),
             f"{j.n(*mi, k, 'delta_pct')} ({j.n(*mi, k, 'low_pct')} to {j.n(*mi, k, 'high_pct')})",
             j.t(*mi, k, "sentence") if ok else f"not comparable: {j.t(*mi, k, 'sentence')}"]
            for k in range(len(j.get(*mi)))
        ])  # fmt: skip
        fid = (*p, "fidelity")
        if isinstance(j.get(*fid), dict):
            caption = f"Fidelity of {pair['b']} against {pair['a']}, request by request" + (
                "" if ok else " (NOT COMPARABLE)"
            )
            out[caption] = _Table(caption, ["figure", "requests", "median |B-A|/A",
                                            "P90 |B-A|/A", "MAPE", "bias (B-A)/A"], [
                [name.upper(), j.n(*fid, "figures", name, "requests"),
                 *(j.n(*fid, "figures", name, k) for k in ("median_ape", "p90_ape", "mape", "bias"))]
                for name in j.get(*fid, "figures")
            ])  # fmt: skip
    return out


def layout_mismatches(page: str, expected: dict[str, _Table]) -> list[str]:
    """Where the page's tables differ from the layout the JSON calls for: a caption, a header,
    a row, or a cell (its text with each data-field number written as {path})."""
    shown = tables(page)
    bad = [f"table {c!r}: shown, not expected" for c in shown if c not in expected]
    for caption, want in expected.items():
        got = shown.get(caption)
        if got is None:
            bad.append(f"table {caption!r}: missing")
            continue
        if got.header != want.header:
            bad.append(f"{caption}: header {got.header}, expected {want.header}")
        if len(got.rows) != len(want.rows):
            bad.append(f"{caption}: {len(got.rows)} rows, expected {len(want.rows)}")
        for row, (g, w) in enumerate(zip(got.rows, want.rows, strict=False)):
            for col, (gc, wc) in enumerate(zip(g, w, strict=False)):
                if gc != wc:
                    where = want.header[col] if want.header else w[0]
                    bad.append(
                        f"{caption}: row {row} ({w[0]}), {where}: shown {gc!r}, expected {wc!r}"
                    )
            if len(g) != len(w):
                bad.append(f"{caption}: row {row}: {len(g)} cells, expected {len(w)}")
    return bad


def _layouts(dirs: ReportDirs) -> list[tuple[Path, dict[str, _Table]]]:
    out = []
    for run in (dirs.run_ok, dirs.run_fail):
        summary = orjson.loads((run / "summary.json").read_bytes())
        out.append((run, run_layout(summary, _al_interval(run))))
    out.append((dirs.sweep, sweep_layout(orjson.loads((dirs.sweep / "sweep.json").read_bytes()))))
    compare = orjson.loads((dirs.compare / "compare.json").read_bytes())
    out.append((dirs.compare, compare_layout(compare)))
    return out


def test_every_table_shows_each_number_under_its_own_header(dirs: ReportDirs) -> None:
    """A number under the wrong column header, beside the wrong row label or in-cell label, or
    computed by the page without a data-field, passes the data-field check alone."""
    for directory, expected in _layouts(dirs):
        assert layout_mismatches(_page(directory), expected) == [], directory


def test_the_run_page_al_interval_is_the_records_ratio_estimate(dirs: ReportDirs) -> None:
    """The one computed number without a data-field: the token-weighted AL's 95% interval,
    against the ratio estimator computed here from records.jsonl."""
    for run in (dirs.run_ok, dirs.run_fail):
        cell = tables(_page(run))["Acceptance"].rows[1]
        interval = _al_interval(run)
        assert cell == ["token-weighted AL", "{figures.acceptance.token_weighted_al} " + interval]
        low, high = (float(x) for x in re.findall(r"\d+\.\d{4}", interval))
        al = orjson.loads((run / "summary.json").read_bytes())["figures"]["acceptance"]
        assert low < al["token_weighted_al"] < high
        assert (low + high) / 2 == pytest.approx(al["token_weighted_al"], abs=1e-4)
