"""report.html for a run, a sweep and a compare: one static page beside the JSON it shows.

The page is self-contained so it reads the same from a file, a CI artifact or an e-mail
attachment: no script, one inline style sheet, plots as inline SVG (matplotlib, text as
paths), and a Content-Security-Policy that forbids every fetch, so a string from a server
cannot make the page load anything either. Every number taken from the JSON file carries
``data-field="<path>"`` (``figures.latency_ms.ttft.mean``, ``stats[0].figures.realized_al.low``,
``replicas["http://a:1"].figures.requests.completed``; see ``resolve_field``), so a test can
compare the page to the file. Plots are drawn from aggregates and downsampled samples, so a
run of 100k requests renders in about the time of a small one.
"""

from __future__ import annotations

import html
import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import orjson

from speclens.runs.figures import DERIVED
from speclens.runs.files import open_new
from speclens.runs.request import RequestRecord
from speclens.runs.stats import realized_al

#: The largest summary.json, sweep.json or compare.json a report reads.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: What of records.jsonl the run plots read (the page says when it stopped short).
MAX_RECORD_LINES = 500_000
MAX_RECORD_BYTES = 1024 * 1024 * 1024
#: Rows in a table listing per-key entries (categories, replicas, points).
MAX_TABLE_ROWS = 2000

REPORT_NAME = "report.html"
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;
max-width:72em;padding:0 1em;color:#1b1b1b;background:#fff}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #d0d0d0;padding:.25em .6em;vertical-align:top}
th{background:#f3f3f3;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.banner{padding:.7em 1em;margin:.8em 0;border-radius:4px;font-weight:600}
.fail{background:#fde2e1;border:1px solid #d93025;color:#8c1d18}
.warn{background:#fff4d6;border:1px solid #e0a800;color:#6b4f00}
.pass{background:#e3f5e6;border:1px solid #1e8e3e;color:#0d5223}
.ok{color:#0d5223;font-weight:600}.bad{color:#8c1d18;font-weight:600}
.note{color:#555;font-size:.9em}.plot svg{max-width:100%;height:auto}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{flex:1 1 30em}
"""


class ReportError(ValueError):
    """A file a report reads is missing, too large or not what its writer writes."""


# ------------------------------------------------------------------------------ field paths

_SAFE_KEY = re.compile(r"[A-Za-z0-9_\-]+\Z")
_TOKEN = re.compile(r'\.?([A-Za-z0-9_\-]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def field_path(*parts: str | int) -> str:
    """The dotted path of ``parts``: ``a.b[0]``; a key that is not a plain word is quoted,
    ``al_by_category["a.b"]``, so every path names one place."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _SAFE_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += "[" + orjson.dumps(part).decode() + "]"
    return out


def resolve_field(data: Any, path: str) -> Any:
    """The value at a ``field_path`` in ``data``; KeyError when there is none."""
    pos, node = 0, data
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise KeyError(f"{path!r}: cannot parse at {pos}")
        key: str | int = (
            m.group(1) if m.group(1) is not None
            else int(m.group(2)) if m.group(2) is not None
            else orjson.loads(m.group(3))
        )  # fmt: skip
        found = (isinstance(key, int) and isinstance(node, list) and key < len(node)) or (
            isinstance(key, str) and isinstance(node, dict) and key in node
        )
        if not found:
            raise KeyError(f"{path!r}: no {key!r}")
        node = node[key]
        pos = m.end()
    return node


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: int | float, digits: int | None) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if digits is None:
        digits = 1 if abs(value) >= 100 else 2 if abs(value) >= 1 else 4
    return f"{value:,.{digits}f}"


@dataclass
class Fields:
    """A JSON document, read leniently (a missing or mistyped field shows as "-"), whose
    numbers are rendered with their ``data-field`` path."""

    data: Any

    def get(self, *parts: str | int) -> Any:
        node = self.data
        for part in parts:
            if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
                node = node[part]
            elif isinstance(part, str) and isinstance(node, dict):
                node = node.get(part)
            else:
                return None
        return node

    def num(self, *parts: str | int, digits: int | None = None) -> str:
        value = self.get(*parts)
        if not _number(value):
            return "-"
        return f'<span data-field="{esc(field_path(*parts))}">{_fmt(value, digits)}</span>'

    def text(self, *parts: str | int) -> str:
        value = self.get(*parts)
        if value is None or value == [] or value == {}:
            return "-"
        if isinstance(value, list):
            return esc(", ".join(map(str, value)))
        if isinstance(value, bool):
            return "yes" if value else "no"
        if _number(value):
            return self.num(*parts)
        return esc(value)

    def interval(self, *parts: str | int, digits: int | None = None) -> str:
        """An Interval's json as ``mean (low to high)``, or the mean alone when it has none."""
        mean = self.num(*parts, "mean", digits=digits)
        if not _number(self.get(*parts, "low")) or not _number(self.get(*parts, "high")):
            return mean if mean != "-" else "-"
        low = self.num(*parts, "low", digits=digits)
        high = self.num(*parts, "high", digits=digits)
        return f'{mean} <span class="note">({low} to {high})</span>'

    def items(self, *parts: str | int) -> Iterator[tuple[str, Any]]:
        node = self.get(*parts)
        if isinstance(node, dict):
            yield from list(node.items())[:MAX_TABLE_ROWS]

    def rows(self, *parts: str | int) -> Iterator[tuple[int, Any]]:
        node = self.get(*parts)
        if isinstance(node, list):
            yield from list(enumerate(node))[:MAX_TABLE_ROWS]


# ------------------------------------------------------------------------------ the page


@dataclass
class Page:
    """An HTML document assembled from escaped parts."""

    title: str
    source: str
    parts: list[str] = field(default_factory=list)

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def heading(self, text: str, level: int = 2) -> None:
        self.add(f"<h{level}>{esc(text)}</h{level}>")

    def banner(self, kind: str, markup: str) -> None:
        self.add(f'<div class="banner {kind}" role="alert">{markup}</div>')

    def note(self, markup: str) -> None:
        self.add(f'<p class="note">{markup}</p>')

    def table(
        self,
        caption: str,
        header: Sequence[str] | None,
        rows: Iterable[Sequence[str]],
        empty: str = "nothing to show",
    ) -> None:
        """``rows`` hold markup (already escaped); cells holding a number align right. A table
        with no row is no table: its caption and why it is empty (``empty``, plain text)."""
        rows = list(rows)
        if not rows:
            self.add(f'<p class="empty"><strong>{esc(caption)}</strong>: '
                     f'<span class="note">{esc(empty)}</span></p>')  # fmt: skip
            return
        out = [f"<table><caption>{esc(caption)}</caption>"]
        if header:
            out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            cells = []
            for i, cell in enumerate(row):
                if i == 0 and not header:
                    cells.append(f"<th>{cell}</th>")
                else:
                    cls = ' class="n"' if cell.startswith("<span data-field") else ""
                    cells.append(f"<td{cls}>{cell}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
        self.add("".join(out))

    def plots(self, svgs: Sequence[str]) -> None:
        if svgs:
            self.add('<div class="plots">' + "".join(svgs) + "</div>")

    def render(self) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="speclens-source" content="{esc(self.source)}">'
            f"<title>{esc(self.title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{esc(self.title)}</h1>" + "\n".join(self.parts) + "</body></html>\n"
        )


def plot(title: str, draw: Callable[..., str], *args: Any) -> str:
    """One plot as a figure element; a plot that cannot be drawn says why instead of failing
    the report (its data came from a server)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            svg = draw(*args)
    except (ValueError, OverflowError, FloatingPointError, RuntimeError) as exc:
        return f'<p class="note">{esc(title)}: not drawn ({esc(str(exc)[:200])})</p>'
    return f'<figure class="plot" aria-label="{esc(title)}">{svg}</figure>'


# ------------------------------------------------------------------------------ reading


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, bounded; ReportError naming the file otherwise."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise ReportError(f"{path}: not found") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_JSON_BYTES:
        raise ReportError(f"{path}: larger than {MAX_JSON_BYTES // 2**20} MiB")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _expect(data: Mapping[str, Any], path: Path, key: str, kind: type) -> None:
    if not isinstance(data.get(key), kind):
        what = "an object" if kind is dict else "a list" if kind is list else kind.__name__
        got = "nothing" if key not in data else type(data[key]).__name__
        raise ReportError(f"{path}: field {key}: expected {what}, got {got}")


def _schema(data: Mapping[str, Any], path: Path, schema: str) -> None:
    if data.get("schema") != schema:
        raise ReportError(f"{path}: field schema: expected {schema!r}, got {data.get('schema')!r}")


def write_page(directory: Path, page: Page) -> Path:
    path = directory / REPORT_NAME
    with open_new(path) as fh:
        fh.write(page.render().encode("utf-8"))
    return path


# ------------------------------------------------------------------------------ run samples

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
    _expect(summary, path, "figures", dict)
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
    _run_overview(page, f)
    _latency_table(page, f)
    _acceptance_table(page, f, samples)
    _derived_table(page, f)
    _replica_table(page, f)
    _verdict_table(page, f)
    for i, _ in f.rows("warnings"):
        page.banner("warn", "warning: " + f.text("warnings", i))
    _run_plots(page, f, samples)
    return page


#: The line an aggregate-only page shows where per-request plots would be.
AGGREGATE_LINE = "aggregate-only: published figures, no per-request data"
_SAFE_URL = re.compile(r"https?://[^\s\"'<>]{1,2000}\Z")


def aggregate_page(summary: dict[str, Any]) -> Page:
    """An aggregate-only run (a published result, or a prediction of one): its settings, its
    provenance (the run's URL as a plain link: the page fetches nothing), the published
    figures, and no plot that needs per-request rows."""
    f = Fields(summary)
    s = ("settings",)
    model = f.get(*s, "model") or "?"
    page = Page(f"speclens run: {model} (aggregate-only)", "summary.json")
    page.banner("warn", esc(AGGREGATE_LINE))

    def lengths(name: str) -> str:
        low, high = f.num(*s, name, "min"), f.num(*s, name, "max")
        return low if f.get(*s, name, "min") == f.get(*s, name, "max") else f"{low} to {high}"

    spec = f.get(*s, "method")
    method = "off" if spec in (None, "none") else f.text(*s, "method")
    page.table("Settings", None, [
        ("model", f.text(*s, "model")),
        ("hardware", f.text(*s, "hardware")),
        ("engine", f.text(*s, "engine")),
        ("image", f.text(*s, "image")),
        ("precision", f.text(*s, "precision")),
        ("parallelism", f"TP {f.num(*s, 'tensor_parallel')}, EP {f.num(*s, 'expert_parallel')}, "
                        f"DP attention {f.text(*s, 'dp_attention')}"),
        ("GPUs", f.num(*s, "gpus")),
        ("input tokens", lengths("input_tokens")),
        ("output tokens", lengths("output_tokens")),
        ("concurrency", f.num(*s, "concurrency")),
        ("speculation", method),
        ("K", f.num(*s, "num_spec_tokens")),
        ("date", f.text(*s, "date")),
        ("executor", f.text(*s, "executor")),
    ])  # fmt: skip
    url = f.get("provenance", "run_url")
    link = (f'<a href="{esc(url)}" rel="noreferrer">{esc(url)}</a>'
            if isinstance(url, str) and _SAFE_URL.match(url) else f.text("provenance", "run_url"))  # fmt: skip
    page.table("Provenance", None, [
        ("source", f.text("provenance", "source")),
        ("run", link),
        ("file", f.text("provenance", "file")),
        ("index", f.num("provenance", "index")),
    ])  # fmt: skip
    keys = ("mean", "p50", "p90", "p99")
    lat = ("figures", "latency_ms")
    page.table("Latency (ms)", ["metric", "mean", "median", "p90", "p99"], [
        (esc(name.upper()), *(f.num(*lat, name, k, digits=2) for k in keys))
        for name in ("ttft", "tpot", "itl", "e2e")
    ])  # fmt: skip
    t, i = ("figures", "throughput"), ("figures", "interactivity")
    page.table("Throughput and interactivity", None, [
        ("total throughput (tok/s)", f.num(*t, "total_tokens_per_s", digits=1)),
        ("total throughput per GPU (tok/s/GPU)", f.num(*t, "total_tokens_per_s_per_gpu", digits=1)),
        ("output throughput (tok/s)", f.num(*t, "output_tokens_per_s", digits=1)),
        ("output throughput per GPU (tok/s/GPU)", f.num(*t, "output_tokens_per_s_per_gpu", digits=1)),
        ("interactivity, median (tok/s/user)", f.num(*i, "p50", digits=2)),
        ("interactivity, mean (tok/s/user)", f.num(*i, "mean", digits=2)),
        ("acceptance length", f.num("figures", "acceptance", "acceptance_length", digits=4)),
    ])  # fmt: skip
    page.heading("Plots")
    page.note(esc(AGGREGATE_LINE) + ": no latency CDF, histogram or per-request plot")
    return page


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
        ("output throughput (tok/s)", f.num(*fig, "throughput", "output_tokens_per_s", digits=1)),
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
        rows.append(
            (
                f"AL ({esc(cat)})",
                f"{f.num(*a, 'al_by_category', cat, 'al', digits=4)} over "
                f"{f.num(*a, 'al_by_category', cat, 'verify_steps')} steps",
            )
        )
    inconsistent = f.get(*a, "inconsistent_requests")
    if isinstance(inconsistent, list) and inconsistent:
        rows.append(("inconsistent requests", esc(len(inconsistent))))
    rows.append(("server counters", _server_counters(f)))
    page.table("Acceptance", None, rows)  # fmt: skip


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
            out = {int(j): float(p) for j, p in expected.items() if _number(p)}
        except ValueError:
            return None
        return {j: p for j, p in out.items() if 0 <= j <= MAX_POSITIONS} or None
    rates = f.get("server", "acceptance", "per_position_rates")
    if not f.get("server", "acceptance", "forced") or not isinstance(rates, list):
        return None
    if (
        not rates
        or len(rates) > MAX_POSITIONS
        or not all(_number(r) and 0 <= r <= 1 for r in rates)
    ):
        return None
    return accepted_count_distribution([float(r) for r in rates])


def forced_al(f: Fields) -> float | None:
    for value in (f.get("verdict", "expected_acceptance_length"),
                  f.get("server", "acceptance", "acceptance_length")):  # fmt: skip
        if _number(value):
            return float(value)
    return None


def _observed_histogram(f: Fields) -> dict[int, int]:
    from speclens.runs.record import MAX_POSITIONS

    out = {}
    for j, n in f.items("figures", "acceptance", "histogram"):
        if j.isdigit() and int(j) <= MAX_POSITIONS and isinstance(n, int) and n > 0:
            out[int(j)] = n
    return out


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
    if not (isinstance(rates, list) and rates and all(_number(r) for r in rates)):
        missing.append("per-position rates: no request reported per-position acceptance")
    else:
        forced_rates = (
            [sum(p for j, p in expected.items() if j > pos) for pos in range(len(rates))]
            if expected else None
        )  # fmt: skip
        svgs.append(plot("per-position rates", hp.position_plot, rates[:64], forced_rates))
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
        if isinstance(row, dict) and _number(row.get("al")) and isinstance(row.get("verify_steps"), int)
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


# ------------------------------------------------------------------------------ sweep report

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


def write_sweep_report(sweep_dir: Path, decision: Mapping[str, Any] | None = None) -> Path:
    """``sweep_dir/report.html`` from ``sweep_dir/sweep.json``; returns its path. ``decision``
    (``speclens sim --at-interactivity``, as decision.json holds it) goes at the page's top."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / "sweep.json"
    sweep = read_json(path)
    _schema(sweep, path, "speclens.sweep/1")
    _expect(sweep, path, "points", list)
    return write_page(sweep_dir, sweep_page(sweep, sweep_dir, decision))


def _decision(page: Page, f: Fields) -> None:
    """The answer of ``--at-interactivity`` first: its line, then each choice's tok/s/GPU at the
    target interactivity (``data-field`` paths under ``decision.``): the Ks of ``sim``
    (decision.json's ``ks``) or the inputs of ``compare`` (compare.json's ``choices``, each
    with its 95% interval)."""
    page.heading("Decision")
    page.add(f'<p class="decision"><strong>{f.text("decision", "headline")}</strong></p>')
    compared = isinstance(f.get("decision", "choices"), list)
    key = "choices" if compared else "ks"
    rows = []
    for i, e in f.rows("decision", key):
        d = ("decision", key, i)
        k = e.get("num_spec_tokens") if isinstance(e, dict) else None
        reason = f.get(*d, "reason")
        value = f.num(*d, "tok_s_gpu", digits=0) if reason is None else esc(str(reason))
        ratio = f.num(*d, "ratio_to_best", digits=3)
        if compared:
            value += _between(f, d, "low", "high", 0)
            ratio += _between(f, d, "ratio_low", "ratio_high", 3)
            rows.append([f.text(*d, "label"), f.num(*d, "num_spec_tokens"), value, ratio])
        else:
            rows.append([f.num(*d, "num_spec_tokens") if k else "no speculation",
                         f.num(*d, "acceptance_length", digits=2), value, ratio])  # fmt: skip
    target = f.get("decision", "tok_s_user")
    page.table(
        f"at {target:g} tok/s/user" if _number(target) else "at the target interactivity",
        ["input", "K", "tok/s/GPU (95% CI)", "ratio to best (95% CI)"] if compared
        else ["K", "AL", "tok/s/GPU", "ratio to best"],
        rows, empty="nothing was compared",
    )  # fmt: skip
    if f.get("decision", "lead"):
        page.note(f.text("decision", "lead"))
    first = f.text("decision", "figure") if compared else f"{f.num('decision', 'gpus')} GPUs"
    page.note(f"{first}; {f.text('decision', 'interval')}")


def _between(f: Fields, d: tuple[str | int, ...], low: str, high: str, digits: int) -> str:
    """`` (low to high)`` as a note, or nothing when either bound is missing."""
    if not (_number(f.get(*d, low)) and _number(f.get(*d, high))):
        return ""
    return (f' <span class="note">({f.num(*d, low, digits=digits)} to '
            f"{f.num(*d, high, digits=digits)})</span>")  # fmt: skip


def _settings_text(f: Fields, *parts: str | int) -> str:
    shown = [
        f"{name.replace('_', ' ')} {f.num(*parts, name)}"
        for name in _SETTINGS
        if _number(f.get(*parts, name))
    ]
    return ", ".join(shown) or "-"


def sweep_page(
    sweep: dict[str, Any], sweep_dir: Path, decision: Mapping[str, Any] | None = None
) -> Page:
    f = Fields(sweep)
    page = Page(f"speclens sweep: {f.get('kind') or '?'} axes", "sweep.json")
    points = [p for _, p in f.rows("points") if isinstance(p, dict)]
    summaries = _point_summaries(points, sweep_dir)
    page.add('<p class="identity">' + " · ".join(
        f"{name} <strong>{value}</strong>" for name, value in _identity(f, summaries)) + "</p>")  # fmt: skip
    if decision is not None:
        _decision(page, Fields({"decision": decision}))
    bad = [p for p in points if p.get("status") != "ok"]
    if bad:
        page.banner("fail", f"{len(bad)} of {len(points)} points did not finish ok: "
                    + esc(", ".join(f"{p.get('id')} ({p.get('status')})" for p in bad[:20])))  # fmt: skip
    axes = "; ".join(f"{esc(k)}: {f.text('axes', k)}" for k, _ in f.items("axes"))
    page.table("Sweep", None, [("kind", f.text("kind")), ("rounds", f.num("rounds")),
                               ("axes", axes or "-")])  # fmt: skip
    published = sum(s.get("aggregate_only") is True for s in summaries)
    if published:
        page.banner("warn", f"{published} of {len(points)} points are {esc(AGGREGATE_LINE)}: "
                    "their figures have no interval (n/a: aggregate-only)")  # fmt: skip
    _stats_table(page, f)
    _points_table(page, f, sweep_dir)
    page.heading("Plots")
    page.plots(_sweep_plots(f))
    return page


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
        })  # fmt: skip
    return out


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


def _stats_table(page: Page, f: Fields) -> None:
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
    page.table("Figures per point (mean, 95% interval)",
               ["engine", "settings", "rounds ok", *(t for _, t, _ in POINT_FIGURES)], rows,
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
    return (float(low) if _number(low) else math.nan, float(high) if _number(high) else math.nan)


def stats_series(
    f: Fields, x_name: str, y_name: str, label: str = "", scale: float = 1.0
) -> list[Any]:
    """Per engine, the stats' (x, y) means with their intervals (y divided by ``scale``)."""
    from speclens.runs.html_plots import Series

    by_engine: dict[str, Any] = {}
    for i, _ in f.rows("stats"):
        x, y = (
            f.get("stats", i, "figures", x_name, "mean"),
            f.get("stats", i, "figures", y_name, "mean"),
        )
        if not (_number(x) and _number(y)):
            continue
        engine = f.get("stats", i, "engine")
        name = " ".join(str(part) for part in (label, engine) if part) or "sweep"
        s = by_engine.setdefault(name, Series(name, [], [], [], []))
        lo, hi = _bounds(f, "stats", i, "figures", y_name)
        s.x.append(float(x))
        s.y.append(float(y) / scale)
        s.x_err.append(_bounds(f, "stats", i, "figures", x_name))
        s.y_err.append((lo / scale, hi / scale))
    return list(by_engine.values())  # fmt: skip


def _sweep_plots(f: Fields) -> list[str]:
    from speclens.runs import html_plots as hp

    svgs = []
    pareto = stats_series(f, "tokens_per_s_per_user", "output_tokens_per_s")
    if pareto:
        svgs.append(plot("Pareto curve", hp.curve_plot, pareto, "tokens/s per user",
                         "output tokens/s", "Throughput against interactivity (95% CI)", "pareto"))  # fmt: skip
    al = stats_series(f, "tpot_ms", "realized_al")
    if al:
        svgs.append(plot("AL against TPOT", hp.curve_plot, al, "TPOT (ms)", "realized AL",
                         "Realized AL against TPOT per point (95% CI)", "sweep-al"))  # fmt: skip
    return svgs


# ------------------------------------------------------------------------------ compare report


def write_compare_report(out_dir: Path, compare_json: Mapping[str, Any] | Path) -> Path:
    """``out_dir/report.html`` from a compare object (or the path of compare.json)."""
    out_dir = Path(out_dir)
    if isinstance(compare_json, Path):
        source = compare_json
        data = read_json(compare_json)
    else:
        source, data = out_dir / "compare.json", dict(compare_json)
    _schema(data, source, "speclens.compare/1")
    _expect(data, source, "pairs", list)
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_page(out_dir, compare_page(data, out_dir))


def compare_page(data: dict[str, Any], out_dir: Path) -> Page:
    f = Fields(data)
    labels = [str(f.get("inputs", i, "label")) for i, _ in f.rows("inputs")]
    page = Page("speclens compare: " + " vs ".join(labels[:8]), "compare.json")
    if isinstance(f.get("decision"), dict):  # the answer first, the tables after
        _decision(page, f)
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


def _pair_section(page: Page, f: Fields, i: int) -> None:
    p = ("pairs", i)
    a, b = str(f.get(*p, "a")), str(f.get(*p, "b"))
    page.heading(f"{a} against {b}")
    ok = f.get(*p, "comparable") is True
    label = f.get(*p, "label") or ("comparable" if ok else "not comparable")
    page.banner("pass" if ok else "fail", esc(label))
    results = {True: '<span class="ok">pass</span>', False: '<span class="bad">fail</span>'}
    page.table("Comparability checks", ["check", "result", "evidence"], [
        (f.text(*p, "checks", j, "name"),
         results.get(f.get(*p, "checks", j, "ok"), "n/a: not run"),
         f.text(*p, "checks", j, "detail"))
        for j, _ in f.rows(*p, "checks")
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
               ["tok/s/user", f"{a} tok/s/GPU", f"{b} tok/s/GPU", "delta %", "reading"], [
        (f.num(*mi, j, "tokens_per_s_per_user", digits=1), f.num(*mi, j, "a_tok_s_gpu", digits=1),
         f.num(*mi, j, "b_tok_s_gpu", digits=1),
         f"{f.num(*mi, j, 'delta_pct', digits=1)} <span class=\"note\">"
         + (f"({f.num(*mi, j, 'low_pct', digits=1)} to {f.num(*mi, j, 'high_pct', digits=1)})"
            if _number(f.get(*mi, j, "low_pct")) or not aggregate else "(no interval)")
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
        page.banner("pass", f"{f.text(*head, 'sentence')} <span class=\"note\">"
                    f"(at {f.num(*head, 'tokens_per_s_per_user', digits=1)} tok/s/user: "
                    f"{f.num(*head, 'off_tok_s_gpu', digits=1)} off, "
                    f"{f.num(*head, 'on_tok_s_gpu', digits=1)} on, "
                    f"{f.num(*head, 'delta_pct', digits=1)}%; no interval: aggregate-only)</span>")  # fmt: skip
    page.table(f"Speculation A/B: {f.get(*ab, 'off')} off, {f.get(*ab, 'on')} "
               f"{f.get(*ab, 'method')} ({f.get(*ab, 'basis')})",
               ["tok/s/user", "off tok/s/GPU", "on tok/s/GPU", "delta %", "reading"], [
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
    """An input's Pareto points per GPU: its sweep's stats, or a run's single point."""
    from speclens.runs.html_plots import Series

    where = _input_dir(f.get("inputs", i, "path"), out_dir)
    if where is None:
        return []
    gpus = f.get("inputs", i, "gpus")
    gpus = float(gpus) if _number(gpus) and gpus > 0 else 1.0
    label = str(f.get("inputs", i, "label") or i)
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
    if not (_number(tpot) and tpot > 0 and _number(tput)):
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
    if series:
        svgs.append(plot("Pareto curves", hp.curve_plot, series, "tokens/s per user",
                         "output tokens/s per GPU", "Throughput per GPU against interactivity "
                         "(95% CI)", "compare-pareto"))  # fmt: skip
    for i, _ in f.rows("pairs"):
        mc = ("pairs", i, "deltas", "matched_concurrency")
        rows = [
            (f"c{f.get(*mc, j, 'concurrency')}", float(f.get(*mc, j, "ratio")),
             float(f.get(*mc, j, "ratio_low")) if _number(f.get(*mc, j, "ratio_low")) else math.nan,
             float(f.get(*mc, j, "ratio_high")) if _number(f.get(*mc, j, "ratio_high")) else math.nan)
            for j, _ in f.rows(*mc)
            if f.get(*mc, j, "figure") == "output_tokens_per_s" and _number(f.get(*mc, j, "ratio"))
        ]  # fmt: skip
        if rows:
            a, b = f.get("pairs", i, "a"), f.get("pairs", i, "b")
            title = f"{hp.label(str(b), 12)} / {hp.label(str(a), 12)} output tok/s"
            if f.get("pairs", i, "comparable") is not True:
                title += " (not comparable)"
            svgs.append(plot(title, hp.ratio_plot, rows, title, f"ratio-{i}"))
    return svgs
