"""report.html for a run: its settings, figures, acceptance, verdict and per-request plots,
from summary.json and records.jsonl (read within bounds)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from speclens.runs.figures import DERIVED
from speclens.runs.html import (
    NO_DATA,
    Fields,
    Page,
    esc,
    expect_field,
    plot,
    read_json,
    write_page,
)
from speclens.runs.html_aggregate import aggregate_page
from speclens.runs.request import RequestRecord
from speclens.runs.rundir import is_number
from speclens.runs.stats import realized_al

#: What of records.jsonl the run plots read (the page says when it stopped short).
MAX_RECORD_LINES = 500_000
MAX_RECORD_BYTES = 1024 * 1024 * 1024

_EXACT = 2.0**53  # counts above this are not exact as floats (and no engine sends them)


def _floats(values: Iterable[Any], scale: float = 1.0) -> np.ndarray:
    """Finite numbers as floats, anything else (None, a string, a bool, inf) as NaN."""
    out = np.fromiter(
        (v if type(v) is float or type(v) is int else math.nan for v in values), dtype=float
    )
    with np.errstate(over="ignore", invalid="ignore"):
        out = out * scale
    out[~np.isfinite(out)] = math.nan
    return out


@dataclass
class Samples:
    """Per measured request (NaN where unknown): what the run plots need; ``note`` says when
    they cover fewer requests than the run had."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    al: np.ndarray
    steps: np.ndarray
    accepted: np.ndarray
    note: str | None = None

    @classmethod
    def of(cls, rows: Sequence[tuple[Any, Any, Any, Any]], note: str | None = None) -> Samples:
        """From (ttft_s, tpot_s, latency_s, spec) per request."""
        specs = [spec if isinstance(spec, dict) else {} for *_, spec in rows]
        return cls(
            ttft=_floats((r[0] for r in rows), 1000.0), tpot=_floats((r[1] for r in rows), 1000.0),
            e2e=_floats((r[2] for r in rows), 1000.0),
            al=_floats(s.get("mean_acceptance_length") for s in specs),
            steps=_floats(s.get("num_spec_steps") for s in specs),
            accepted=_floats(s.get("num_accepted_draft_tokens") for s in specs), note=note,
        )  # fmt: skip

    def al_tpot(self) -> np.ndarray:
        """(tpot_ms, AL) rows of the requests that have both."""
        keep = np.isfinite(self.al) & np.isfinite(self.tpot) & (self.tpot > 0)
        return np.column_stack([self.tpot[keep], self.al[keep]])

    def counts(self) -> tuple[list[int], list[int]]:
        """(accepted, steps) of the requests with verify steps, for ``stats.realized_al``."""
        keep = (self.steps > 0) & (self.steps < _EXACT) & (self.accepted >= 0)
        keep &= self.accepted < _EXACT
        return (self.accepted[keep].astype(np.int64).tolist(),
                self.steps[keep].astype(np.int64).tolist())  # fmt: skip


def samples_from_records(records: Iterable[RequestRecord]) -> Samples:
    return Samples.of(
        [(r.ttft, r.tpot, r.latency, r.spec) for r in records if r.success and not r.warmup]
    )


def _row(line: bytes) -> Any:
    """A records.jsonl line without its ``raw`` responses (the last key, and most of the
    bytes) when it can be cut there, else the whole line."""
    cut = line.find(b',"raw":')
    if cut > 0:
        try:
            return orjson.loads(line[:cut] + b"}")
        except orjson.JSONDecodeError:
            pass
    return orjson.loads(line)


def samples_from_file(path: Path) -> Samples:
    """``records.jsonl`` read up to MAX_RECORD_LINES lines or MAX_RECORD_BYTES bytes;
    unreadable lines are counted and skipped (the records' own reader judges them)."""
    rows: list[tuple[Any, Any, Any, Any]] = []
    lines = read = bad = 0
    note = None
    try:
        with path.open("rb") as fh:
            for line in fh:
                lines += 1
                read += len(line)
                if lines > MAX_RECORD_LINES or read > MAX_RECORD_BYTES:
                    note = f"plots drawn from the first {lines - 1} lines of {path.name}"
                    break
                try:
                    row = _row(line)
                except orjson.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(row, dict) and row.get("success") is True and not row.get("warmup"):
                    rows.append((row.get("ttft_s"), row.get("tpot_s"), row.get("latency_s"),
                                 row.get("spec_decode_acceptance")))  # fmt: skip
    except FileNotFoundError:
        note = f"no {path.name}: the per-request plots are not drawn"
    except OSError as exc:
        note = f"{path.name}: cannot read ({exc.strerror or exc}): per-request plots skipped"
    if bad:
        note = (note + "; " if note else "") + f"{bad} unreadable lines skipped"
    return Samples.of(rows, note)


# ------------------------------------------------------------------------------ run report


def write_run_report(run_dir: Path, records: Sequence[RequestRecord] | None = None) -> Path:
    """``run_dir/report.html`` from ``run_dir/summary.json`` (and the records, or
    ``records.jsonl`` when none are given). Returns its path; ReportError on a bad summary."""
    run_dir = Path(run_dir)
    path = run_dir / "summary.json"
    summary = read_json(path)
    expect_field(summary, path, "figures", dict)
    if summary.get("aggregate_only") is True:
        return write_page(run_dir, aggregate_page(summary))
    samples = (
        samples_from_records(records)
        if records is not None
        else samples_from_file(run_dir / "records.jsonl")
    )
    return write_page(run_dir, run_page(summary, samples))


def run_page(summary: dict[str, Any], samples: Samples) -> Page:
    f = Fields(summary)
    model = f.get("settings", "model") or f.get("server", "model") or "?"
    page = Page(f"speclens run: {model}", "summary.json")
    _run_banners(page, f)
    for i, _ in f.rows("warnings"):
        page.banner("warn", "warning: " + f.text("warnings", i))
    _glance_table(page, f, samples)
    _verdict_table(page, f)
    _run_overview(page, f)
    _latency_table(page, f)
    _acceptance_table(page, f, samples)
    _spread_table(page, f)
    _derived_table(page, f)
    _replica_table(page, f)
    _run_plots(page, f, samples)
    return page


def _glance_table(page: Page, f: Fields, samples: Samples) -> None:
    """The few figures a reader wants first: what finished, the output throughput, the
    realized AL with its interval, and the median TTFT and TPOT."""
    fig = ("figures",)
    lat = (*fig, "latency_ms")
    page.table("At a glance", None, [
        ("requests", f"{f.num(*fig, 'requests', 'completed')} completed, "
                     f"{f.num(*fig, 'requests', 'failed')} failed"),
        *_output_rows(f),
        ("token-weighted AL", f.num(*fig, "acceptance", "token_weighted_al", digits=4)
         + _al_interval(samples)),
        ("TTFT p50 (ms)", f.num(*lat, "ttft", "p50", digits=2)),
        ("TPOT p50 (ms)", f.num(*lat, "tpot", "p50", digits=2)),
    ])  # fmt: skip


def _output_rows(f: Fields) -> list[tuple[str, str]]:
    """The run page's one throughput, output tokens per second (input tokens are counted apart,
    never added in): the server's, and per GPU where the run states it."""
    t = ("figures", "throughput")
    rows = [("output throughput (tok/s)", f.num(*t, "output_tokens_per_s", digits=1))]
    if is_number(f.get(*t, "output_tokens_per_s_per_gpu")):
        rows.append(("output throughput per GPU (tok/s/GPU)",
                     f.num(*t, "output_tokens_per_s_per_gpu", digits=1)))  # fmt: skip
    return rows


def verdict_word(verdict: Mapping[str, Any]) -> str:
    """PASS, FAIL or INCONCLUSIVE, as the console says it (a vetoed verdict is FAIL)."""
    if verdict.get("passed"):
        return "PASS"
    if verdict.get("inconclusive") and "schedule_passed" not in verdict:
        return "INCONCLUSIVE"
    return "FAIL"


def _run_banners(page: Page, f: Fields) -> None:
    verdict = f.get("verdict")
    if isinstance(verdict, dict):
        word = verdict_word(verdict)
        kind = {"PASS": "pass", "FAIL": "fail"}.get(word, "warn")
        page.banner(
            kind,
            f"verification {word}: {f.text('verdict', 'reason')} (expected AL "
            f"{f.num('verdict', 'expected_acceptance_length')}; evidence: "
            f"{f.num('verdict', 'verify_steps')} verify steps)",
        )
    if f.get("failures", "exceeded"):
        page.banner(
            "fail",
            f"run FAIL: {f.num('failures', 'failed')} of {f.num('failures', 'sent')} requests "
            f"failed (allowed share {f.num('failures', 'max_rate', digits=4)})",
        )
    if f.get("figures", "interrupted"):
        page.banner("warn", "the run was interrupted: its figures cover the finished requests")


def _run_overview(page: Page, f: Fields) -> None:
    s = ("settings",)
    load = (
        f"concurrency {f.num(*s, 'concurrency')}"
        if f.get(*s, "request_rate") is None
        else f"{f.num(*s, 'request_rate')} req/s (burstiness {f.num(*s, 'burstiness')})"
    )
    page.table("Settings", None, [
        ("model", f.text(*s, "model")),
        ("server", f.text(*s, "urls") if f.get(*s, "urls") else f.text(*s, "url")),
        ("engine", f"{f.text('server', 'engine')} {f.text('server', 'version')} "
                   f"({f.text('server', 'executor')}, {f.text(*s, 'backend')} wire)"),
        ("load", load),
        ("requests", f.num(*s, "num_requests")),
        ("dataset", f.text(*s, "dataset") + (f" ({f.text(*s, 'dataset_path')})"
                                             if f.get(*s, "dataset_path") else "")),
        ("sampling", f"max tokens {f.num(*s, 'max_tokens')}, ignore-eos "
                     f"{f.text(*s, 'ignore_eos')}, temperature {f.num(*s, 'temperature', digits=2)}"),
        ("server acceptance", _server_acceptance(f)),
    ])  # fmt: skip
    fig = ("figures",)
    rows = [
        ("requests", f"{f.num(*fig, 'requests', 'completed')} completed, "
                     f"{f.num(*fig, 'requests', 'failed')} failed, "
                     f"{f.num(*fig, 'requests', 'warmup')} warm-up"),
        ("duration (s)", f.num(*fig, "duration_s")),
        ("request throughput (req/s)", f.num(*fig, "throughput", "requests_per_s", digits=2)),
        *_output_rows(f),
        ("output tokens", f.num(*fig, "throughput", "total_output_tokens")),
        ("prompt tokens", f.num(*fig, "throughput", "total_prompt_tokens")),
    ]  # fmt: skip
    if isinstance(f.get(*fig, "goodput"), dict):
        slo = ", ".join(
            f"{esc(k)} {f.num(*fig, 'goodput', 'slo_ms', k)} ms"
            for k, _ in f.items(*fig, "goodput", "slo_ms")
        )
        rows.append(("goodput (req/s)", f"{f.num(*fig, 'goodput', 'requests_per_s', digits=2)} "
                     f"({f.num(*fig, 'goodput', 'fraction', digits=4)} within {slo})"))  # fmt: skip
    page.table("Run", None, rows)
    errors = [
        (f.num("failures", "first_errors", i, "count"), f.text("failures", "first_errors", i, "error"))
        for i, _ in f.rows("failures", "first_errors")
    ]  # fmt: skip
    if errors:
        page.table("First errors", ["count", "error"], errors)


def _server_acceptance(f: Fields) -> str:
    a = ("server", "acceptance")
    if not isinstance(f.get(*a), dict):
        return "-"
    forced = f.get(*a, "forced")
    text = f"{f.text(*a, 'method')}, K {f.num(*a, 'num_speculative_tokens')}"
    if forced:
        text += f", forced AL {f.num(*a, 'acceptance_length', digits=4)}"
    return text + ("" if forced else ", natural acceptance")


def _latency_table(page: Page, f: Fields) -> None:
    keys = ("mean", "p50", "p90", "p99", "min", "max")
    rows = []
    for name, dist in f.items("figures", "latency_ms"):
        cells = [f.num("figures", "latency_ms", name, k, digits=2) for k in keys]
        rows.append((esc(name.upper()), *(cells if isinstance(dist, dict) else ["-"] * 6)))
    page.table("Latency (ms)", ["metric", *keys], rows,
               empty="no request finished with latency figures")  # fmt: skip


def _acceptance_table(page: Page, f: Fields, samples: Samples) -> None:
    a = ("figures", "acceptance")
    rows = [
        ("requests with stats", f"{f.num(*a, 'requests_with_stats')} ({f.text(*a, 'adapters')})"),
        ("token-weighted AL", f.num(*a, "token_weighted_al", digits=4)
         + _al_interval(samples)),
    ]  # fmt: skip
    if f.get(*a, "counts_only_al"):
        rows.append(("counts only", f.text(*a, "counts_only_al")))
    if isinstance(f.get(*a, "per_request_al"), dict):
        rows.append(("per-request AL", ", ".join(
            f"{k} {f.num(*a, 'per_request_al', k, digits=4)}" for k in ("mean", "p50", "p90", "p99")
        )))  # fmt: skip
    refused = f.get(*a, "draft_rate_refused")
    rows += [
        ("draft acceptance rate", f.text(*a, "draft_rate_refused") if refused
         else f.num(*a, "draft_acceptance_rate", digits=4)),
        ("accepted per verify step", f.num(*a, "accepted_per_step", digits=4)),
        ("verify steps", f.num(*a, "verify_steps")),
    ]  # fmt: skip
    if f.get(*a, "draft_coverage_requests"):
        rows.append(
            (
                "draft coverage",
                f"{f.num(*a, 'draft_coverage', digits=4)} of "
                f"{f.num(*a, 'decode_steps')} decode steps "
                f"({f.num(*a, 'draft_coverage_requests')} requests)",
            )
        )
        rows.append(("tokens per decode step", f.num(*a, "tokens_per_decode_step", digits=4)))
    hist = ", ".join(f"{esc(j)}: {f.num(*a, 'histogram', j)}" for j, _ in f.items(*a, "histogram"))
    rows.append(("histogram (accepted: steps)", hist or "-"))
    rows.append(("zero-step requests", f.num(*a, "zero_step_requests")))
    for cat, _ in f.items(*a, "al_by_category"):
        c = (*a, "al_by_category", cat)
        steps = f.num(*c, "verify_steps")
        rows.append((
            f"AL ({esc(cat)})",
            f"{NO_DATA} ({steps} verify steps)" if f.get(*c, "verify_steps") == 0
            else f"{f.num(*c, 'al', digits=4)} over {steps} steps",
        ))  # fmt: skip
    inconsistent = f.get(*a, "inconsistent_requests")
    if isinstance(inconsistent, list) and inconsistent:
        rows.append(("inconsistent requests", esc(len(inconsistent))))
    rows.append(("server counters", _server_counters(f)))
    page.table("Acceptance", None, rows)  # fmt: skip


#: The spread table's columns after its label: (header, path under a per_request block).
_SPREAD_COLUMNS = (
    ("requests", ("requests",)),
    ("verify steps", ("verify_steps",)),
    ("p10", ("quantiles", "p10")),
    ("p50", ("quantiles", "p50")),
    ("p90", ("quantiles", "p90")),
    ("within", ("variance", "within")),
    ("between observed", ("variance", "between_observed")),
    ("sampling noise", ("variance", "noise")),
    ("between", ("variance", "between")),
    ("between share of the whole", ("variance", "between_share")),
)


def _spread_table(page: Page, f: Fields) -> None:
    """The per-request AL distribution, the run's and each category's: quantiles weighted by
    verify steps, and the per-step variance of tokens per verify step split within and between
    requests (a part that cannot be known says so)."""
    a = ("figures", "acceptance")
    blocks = [("all", (*a, "per_request"))] + [
        (cat, (*a, "al_by_category", cat, "per_request"))
        for cat, _ in f.items(*a, "al_by_category")
    ]
    rows = []
    for name, at in blocks:
        if not isinstance(f.get(*at), dict):
            continue
        cells = []
        for header, path in _SPREAD_COLUMNS:
            cell = f.num(*at, *path, digits=None if header.endswith("steps") else 4)
            if header == "within" and f.get(*at, *path) is None:
                cell = f"unknown: {f.num(*at, 'without_histogram')} requests without a histogram"
            cells.append(cell)
        rows.append((esc(name), *cells))
    if not rows:
        return
    page.table("AL between requests (each request weighted by its verify steps)",
               ["category", *(h for h, _ in _SPREAD_COLUMNS)], rows)  # fmt: skip
    page.note(
        "Variance of tokens per verify step: within (each request's own, about its AL) plus "
        "between observed (of the requests' ALs) is the whole; between is the observed part "
        "less the sampling noise a request's few steps put in its AL (its steps taken as "
        "independent)."
    )


def _al_interval(samples: Samples) -> str:
    """The realized AL's 95% interval from the requests (ratio-estimator SE), when known."""
    accepted, steps = samples.counts()
    if len(steps) < 2:
        return ""
    interval = realized_al(accepted, steps).interval()
    if not (math.isfinite(interval.low) and math.isfinite(interval.high)):
        return ""
    return (
        f' <span class="note derived">(95% CI {interval.low:.4f} to {interval.high:.4f}, '
        f"ratio-estimator SE over {interval.n} requests)</span>"
    )


def _server_counters(f: Fields) -> str:
    c = ("server_check",)
    if f.get(*c, "available") and f.get(*c, "compared") is not False:
        state = "agree" if f.get(*c, "consistent") else f.text(*c, "flags")
        return f"{state} ({f.text(*c, 'source')}); server AL {f.num(*c, 'server_al', digits=4)}"
    return f.text(*c, "note")


def _derived_table(page: Page, f: Fields) -> None:
    d = ("figures", "acceptance", "derivable")
    rows = [
        (esc(engine), f.num(*d, engine, "requests"), *(f.text(*d, engine, key) for key, _ in DERIVED))
        for engine, _ in f.items(*d)
    ]  # fmt: skip
    if rows:
        page.table("Derived per engine (yes / some requests / no)",
                   ["engine", "requests", *(title for _, title in DERIVED)], rows)  # fmt: skip


def _replica_table(page: Page, f: Fields) -> None:
    rows = []
    for url, _ in f.items("replicas"):
        r = ("replicas", url, "figures")
        rows.append((
            esc(url), f.num(*r, "requests", "completed"), f.num(*r, "requests", "failed"),
            f.num(*r, "throughput", "requests_per_s", digits=2),
            f.num(*r, "acceptance", "token_weighted_al", digits=4),
            "agree" if f.get("replicas", url, "server_check", "consistent") else
            f.text("replicas", url, "server_check", "note"),
        ))  # fmt: skip
    if rows:
        page.table("Replicas", ["replica", "completed", "failed", "req/s", "AL", "server counters"],
                   rows)  # fmt: skip


def _verdict_table(page: Page, f: Fields) -> None:
    v = ("verdict",)
    if not isinstance(f.get(*v), dict):
        return
    expected = ", ".join(
        f"{esc(j)}: {f.num(*v, 'expected_distribution', j, digits=4)}"
        for j, _ in f.items(*v, "expected_distribution")
    )
    interval = (
        f"{f.num(*v, 'interval', 0, digits=4)} to {f.num(*v, 'interval', 1, digits=4)}"
        if isinstance(f.get(*v, "interval"), list) else "-"
    )  # fmt: skip
    page.table("Verification", None, [
        ("verdict", esc(verdict_word(f.get(*v)))),
        ("reason", f.text(*v, "reason")),
        ("expected AL", f.num(*v, "expected_acceptance_length", digits=4)),
        ("realized AL", f.num(*v, "realized_acceptance_length", digits=4)),
        ("accepted band", interval),
        ("K", f.num(*v, "num_spec_tokens")),
        ("verify steps", f.num(*v, "verify_steps")),
        ("forced schedule (accepted: share)", expected or "-"),
        ("observed / expected split", f"{f.num(*v, 'observed_split', digits=4)} / "
                                      f"{f.num(*v, 'expected_split', digits=4)}"),
    ])  # fmt: skip


# ------------------------------------------------------------------------------ run plots


def forced_schedule(f: Fields) -> dict[int, float] | None:
    """The accepted-count distribution the run was forced to: the verdict's, else the one the
    server's forced per-position rates imply."""
    from speclens.acceptance import accepted_count_distribution
    from speclens.runs.record import MAX_POSITIONS

    expected = f.get("verdict", "expected_distribution")
    if isinstance(expected, dict) and expected:
        try:
            out = {int(j): float(p) for j, p in expected.items() if is_number(p)}
        except ValueError:
            return None
        return {j: p for j, p in out.items() if 0 <= j <= MAX_POSITIONS} or None
    rates = f.get("server", "acceptance", "per_position_rates")
    if not f.get("server", "acceptance", "forced") or not isinstance(rates, list):
        return None
    if (
        not rates
        or len(rates) > MAX_POSITIONS
        or not all(is_number(r) and 0 <= r <= 1 for r in rates)
    ):
        return None
    return accepted_count_distribution([float(r) for r in rates])


def forced_al(f: Fields) -> float | None:
    for value in (f.get("verdict", "expected_acceptance_length"),
                  f.get("server", "acceptance", "acceptance_length")):  # fmt: skip
        if is_number(value):
            return float(value)
    return None


def _observed_histogram(f: Fields) -> dict[int, int]:
    from speclens.runs.record import MAX_POSITIONS

    out = {}
    for j, n in f.items("figures", "acceptance", "histogram"):
        if j.isdigit() and int(j) <= MAX_POSITIONS and isinstance(n, int) and n > 0:
            out[int(j)] = n
    return out


def _request_histogram(
    f: Fields,
) -> tuple[list[float], list[float], int, dict[str, float]] | None:
    """The run's histogram over requests as the plot takes it, when summary.json holds one
    that is well formed (increasing edges, a share per bin, its quantiles numbers)."""
    block = ("figures", "acceptance", "per_request")
    edges = f.get(*block, "histogram", "edges")
    shares = f.get(*block, "histogram", "step_share")
    requests = f.get(*block, "requests")
    quantiles = {name: f.get(*block, "quantiles", name) for name in ("p10", "p50", "p90")}
    if not (isinstance(edges, list) and isinstance(shares, list) and isinstance(requests, int)):
        return None
    numbers = [*edges, *shares, *quantiles.values()]
    if not shares or len(edges) != len(shares) + 1 or not all(map(is_number, numbers)):
        return None
    if any(b <= a for a, b in pairwise(edges)):
        return None
    return ([float(e) for e in edges], [float(s) for s in shares], requests,
            {name: float(q) for name, q in quantiles.items()})  # fmt: skip


def _run_plots(page: Page, f: Fields, samples: Samples) -> None:
    from speclens.runs import html_plots as hp

    page.heading("Plots")
    svgs = []
    expected = forced_schedule(f)
    observed = _observed_histogram(f)
    missing = []
    if observed:
        svgs.append(plot("acceptance histogram", hp.histogram_plot, observed, expected,
                         sum(observed.values())))  # fmt: skip
    else:
        missing.append("acceptance histogram: no request reported an acceptance histogram")
    rates = f.get("figures", "acceptance", "per_position_rates")
    if not (isinstance(rates, list) and rates and all(is_number(r) for r in rates)):
        missing.append("per-position rates: no request reported per-position acceptance")
    else:
        forced_rates = (
            [sum(p for j, p in expected.items() if j > pos) for pos in range(len(rates))]
            if expected else None
        )  # fmt: skip
        svgs.append(plot("per-position rates", hp.position_plot, rates[:64], forced_rates))
    spread = _request_histogram(f)
    if spread is not None:
        svgs.append(plot("AL per request", hp.request_al_plot, *spread))
    al_tpot = samples.al_tpot()
    if len(al_tpot):
        svgs.append(plot("AL against TPOT", hp.scatter_plot, hp.thin(al_tpot), len(al_tpot),
                         forced_al(f)))  # fmt: skip
    else:
        missing.append("AL against TPOT: no request reported both its acceptance and its TPOT")
    curves = {
        name: hp.downsample_sorted(values)
        for name, values in (("TTFT", samples.ttft), ("TPOT", samples.tpot), ("E2E", samples.e2e))
        if np.isfinite(values).any()
    }
    if curves:
        svgs.append(plot("latency CDFs", hp.cdf_plot, curves))
    categories = [
        (str(c), float(row["al"]), int(row["verify_steps"]))
        for c, row in f.items("figures", "acceptance", "al_by_category")
        if isinstance(row, dict) and is_number(row.get("al")) and isinstance(row.get("verify_steps"), int)
    ]  # fmt: skip
    if categories:
        svgs.append(plot("AL per category", hp.category_plot, categories, forced_al(f)))
    page.plots(svgs)
    if samples.note:
        page.note(esc(samples.note))
    if not svgs:
        page.note("nothing to plot: no request finished with figures")
    elif missing:
        page.note("not drawn: " + esc("; ".join(missing)))
