"""Reports: rich console tables, and files: records.jsonl (streamed as requests finish, so a crash
or Ctrl-C keeps every finished request), then summary.json, summary.csv and PNG plots."""

from __future__ import annotations

import csv
import errno
import io
import math
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeGuard

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speclens.runs.figures import DERIVED
from speclens.runs.files import open_new
from speclens.runs.html import NO_DATA
from speclens.runs.request import RequestRecord


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    figures = summary["figures"]
    req, tput = figures["requests"], figures["throughput"]
    head = Table(title="Run", show_header=False)
    head.add_row(
        "requests", f"{req['completed']} completed, {req['failed']} failed, {req['warmup']} warm-up"
    )
    head.add_row(
        "duration",
        f"{figures['duration_s']:.2f} s" + (" (interrupted)" if figures["interrupted"] else ""),
    )
    head.add_row("request throughput", f"{tput['requests_per_s']:.2f} req/s")
    head.add_row("output throughput", f"{tput['output_tokens_per_s']:,.1f} tok/s")
    if "goodput" in figures:
        head.add_row("goodput", escape(goodput_sentence(figures["goodput"], req["completed"])))
    console.print(head)
    for row in (summary.get("failures") or {}).get("first_errors", []):
        console.print(f"  [red]error[/] (x{row['count']}): {escape(row['error'])}", soft_wrap=True)

    latency = Table(title="Latency (ms)")
    for col in ("metric", "mean", "p50", "p90", "p99", "min", "max"):
        latency.add_column(col, justify="right" if col != "metric" else "left")
    for name, dist in figures["latency_ms"].items():
        if dist is None:
            latency.add_row(name.upper(), *["-"] * 6)
        else:
            latency.add_row(
                name.upper(), *(_fmt(dist[k]) for k in ("mean", "p50", "p90", "p99", "min", "max"))
            )
    console.print(latency)

    acc = figures["acceptance"]
    table = Table(title="Acceptance", show_header=False)
    table.add_row(
        "requests with stats",
        f"{acc['requests_with_stats']} ({', '.join(acc['adapters']) or 'none'})",
    )
    table.add_row("token-weighted AL", _fmt(acc["token_weighted_al"], 4))
    if acc.get("counts_only_al"):
        table.add_row("counts only", escape(acc["counts_only_al"]))
    per_req = acc["per_request_al"]
    if per_req:
        table.add_row(
            "per-request AL",
            f"mean {per_req['mean']:.4f}, p50 {per_req['p50']:.4f}, p90 {per_req['p90']:.4f}, p99 {per_req['p99']:.4f}",
        )
    if isinstance(acc.get("per_request"), dict):
        table.add_row("per-request AL (step-weighted)", escape(spread_text(acc["per_request"])))
        table.add_row("variance per verify step", escape(variance_text(acc["per_request"])))
    refused = acc.get("draft_rate_refused")
    table.add_row(
        "draft acceptance rate",
        escape(refused) if refused else _fmt(acc["draft_acceptance_rate"], 4),
    )
    table.add_row("accepted per verify step", _fmt(acc["accepted_per_step"], 4))
    table.add_row("verify steps", str(acc["verify_steps"]))
    if acc.get("draft_coverage_requests"):
        table.add_row(
            "draft coverage",
            f"{_fmt(acc['draft_coverage'], 4)} of {acc['decode_steps']} decode steps "
            f"({acc['draft_coverage_requests']} requests)",
        )
        table.add_row("tokens per decode step", _fmt(acc["tokens_per_decode_step"], 4))
    table.add_row(
        "histogram (accepted: steps)",
        ", ".join(f"{j}: {n}" for j, n in acc["histogram"].items()) or "-",
    )
    table.add_row("zero-step requests", str(acc["zero_step_requests"]))
    for category, row in acc["al_by_category"].items():
        table.add_row(f"AL ({escape(str(category))})", category_al_text(row))
        if isinstance(row.get("per_request"), dict):
            block = row["per_request"]
            table.add_row(f"  per-request AL ({escape(str(category))})",
                          escape(f"{spread_text(block)}; {variance_text(block)}"))  # fmt: skip
    if acc["inconsistent_requests"]:
        table.add_row("inconsistent requests", str(len(acc["inconsistent_requests"])))
    server = summary.get("server_check") or {}
    if server:
        table.add_row("server counters", escape(server_counters_text(server)))
    console.print(table)
    if acc.get("derivable"):
        console.print(derivation_table(acc["derivable"]))
    if summary.get("replicas"):
        console.print(replica_table(summary["replicas"]))
    for warning in summary.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    verdict = summary.get("verdict")
    fails = summary.get("failures") or {}
    if not verdict and fails.get("exceeded"):
        console.print(
            f"[bold red]run FAIL[/]: {fails['failed']} of {fails['sent']} requests failed "
            f"(max {fails['max_rate'] * 100:g}%)",
            soft_wrap=True,
        )
    if verdict:
        print_verdict(console, verdict, acc)


def category_al_text(row: dict[str, Any]) -> str:
    """A category's AL over its verify steps; "no data" when it had none (its 1.0 is the
    formula's empty case, not a measured AL)."""
    if not row["verify_steps"]:
        return f"{NO_DATA} (0 verify steps)"
    return f"{row['al']:.4f} over {row['verify_steps']} steps"


#: The quantiles a report shows of a spread (all of them are in summary.json).
SHOWN_LEVELS = ("p10", "p50", "p90")


def spread_text(block: dict[str, Any]) -> str:
    """A per-request AL distribution (``figures.acceptance.per_request``) in one line: its
    p10, p50 and p90, each request weighted by its verify steps."""
    quantiles = ", ".join(f"{name} {block['quantiles'][name]:.4f}" for name in SHOWN_LEVELS)
    return f"{quantiles} over {block['requests']} requests, each weighted by its verify steps"


def variance_text(block: dict[str, Any]) -> str:
    """The per-step variance of tokens per verify step, split within and between requests;
    what cannot be split says why (a request without its histogram, no request of two steps)."""
    v = block["variance"]
    observed = f"{v['between_observed']:.4f}"
    if v["within"] is None:
        return (
            f"within unknown: {block['without_histogram']} of {block['requests']} requests "
            f"report no acceptance histogram; between at most {observed} (its sampling noise "
            "unknown)"
        )
    if v["between"] is None:
        return (
            f"within {v['within']:.4f}; between at most {observed}: no request has two verify "
            "steps to size its sampling noise"
        )
    total = f"the per-step variance {v['total']:.4f}"
    share = f"; {total}" if v["between_share"] is None else f": {v['between_share']:.1%} of {total}"
    return (
        f"within {v['within']:.4f}, between {v['between']:.4f} (observed {observed} less "
        f"sampling noise {v['noise']:.4f}){share}"
    )


#: How a goodput SLO's metric reads in a sentence.
_SLO_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E latency"}


def goodput_sentence(good: dict[str, Any], completed: int) -> str:
    """Goodput as one sentence: the rate of requests that met every SLO, their share of the
    completed requests and each SLO in ms (``figures.goodput``), or that nothing completed."""
    limits = ", ".join(
        f"{_SLO_NAMES.get(name, str(name))} ≤ {limit:,.4g} ms"
        for name, limit in (good.get("slo_ms") or {}).items()
    )
    if not completed:
        return f"no request completed, so none met the SLO ({limits})"
    met = round(good["fraction"] * completed)
    return (
        f"{good['requests_per_s']:.2f} req/s met the SLO ({limits}): {met} of {completed} "
        f"completed requests ({good['fraction']:.1%})"
    )


def server_counters_text(check: dict[str, Any]) -> str:
    """The server check in one line: "agree" only when the client's requests were compared
    with the counters; with nothing to compare (``compared``: False) or no counters, its note."""
    if not check.get("available") or check.get("compared") is False:
        return str(check.get("note") or "-")
    state = "agree" if check.get("consistent") else "; ".join(check.get("flags") or [])
    return f"{state} ({check.get('source')})"


def print_verdict(console: Console, verdict: dict[str, Any], acc: dict[str, Any]) -> None:
    """The verification line, with the evidence it rests on: a vetoed verdict (failed requests,
    an interrupted run) is FAIL; one with too few verify steps is INCONCLUSIVE, never PASS."""
    vetoed = "schedule_passed" in verdict
    word = "PASS" if verdict["passed"] else "FAIL"
    if verdict.get("inconclusive") and not vetoed:
        word = "INCONCLUSIVE"
    style = {"PASS": "bold green", "FAIL": "bold red"}.get(word, "bold yellow")
    steps = verdict.get("verify_steps", acc.get("histogram_steps", acc["verify_steps"]))
    n = verdict.get("left_out_requests")
    left_out = f"; {n} requests left out: their stats exceed their completion_tokens" if n else ""
    console.print(
        f"[{style}]verification {word}[/]: {escape(verdict['reason'])} "
        f"(expected AL {verdict['expected_acceptance_length']:g}; evidence: {steps} verify "
        f"steps in {verdict.get('evidence_requests', acc['requests_with_stats'])} requests "
        f"with stats{left_out})",
        soft_wrap=True,
    )


def derivation_table(derivable: dict[str, Any]) -> Table:
    """Per engine: which figures its responses (and the server's counters) could give."""
    table = Table(title="Derived per engine (yes / some requests / no)")
    table.add_column("engine")
    table.add_column("requests", justify="right")
    for _, title in DERIVED:
        table.add_column(title)
    for engine, row in derivable.items():
        table.add_row(
            escape(engine), str(row["requests"]), *(str(row.get(key, "-")) for key, _ in DERIVED)
        )
    return table


def replica_table(replicas: dict[str, Any]) -> Table:
    """One row per replica: its requests, throughput, AL and its own server check."""
    table = Table(title="Replicas")
    for col in ("replica", "completed", "failed", "req/s", "AL", "server counters"):
        table.add_column(col, justify="left" if col in ("replica", "server counters") else "right")
    for url, row in replicas.items():
        figures, check = row["figures"], row["server_check"]
        counters = server_counters_text(check)
        table.add_row(
            escape(url), str(figures["requests"]["completed"]), str(figures["requests"]["failed"]),
            f"{figures['throughput']['requests_per_s']:.2f}",
            _fmt(figures["acceptance"]["token_weighted_al"], 4), escape(counters),
        )  # fmt: skip
    return table


def _flatten(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list) and not all(isinstance(v, int | float | str) for v in data):
        for i, value in enumerate(data):
            yield from _flatten(value, f"{prefix}[{i}]")
    else:
        yield prefix, data


def record_row(record: RequestRecord) -> dict[str, Any]:
    """One records.jsonl line. Inter-token gaps are ``[gap, tokens]`` runs, so a chunk that
    claims a billion tokens is one pair, not a billion numbers."""
    return {
        "index": record.index,
        "category": record.category,
        "warmup": record.warmup,
        "replica": record.replica,
        "success": record.success,
        "status": record.status,
        "error": record.error,
        "scheduled_s": record.scheduled,
        "start_s": record.start,
        "ttft_s": record.ttft,
        "latency_s": record.latency,
        "tpot_s": record.tpot,
        "itl_runs_s": [[gap, tokens] for gap, tokens in record.itl_runs],
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "finish_reason": record.finish_reason,
        "unparsable_events": record.unparsable_events,
        "anomalies": record.anomalies,
        "spec_decode_acceptance": record.spec,
        "spec_decode_choices": record.spec_choices,
        "spec_decode_status": record.spec_status,
        "spec_decode_adapter": record.spec_adapter,
        "spec_decode_message": record.spec_message,
        "raw": record.responses,
    }


def record_from_row(row: dict[str, Any]) -> RequestRecord:
    """The record a ``record_row`` line was written from, as far as every figure needs it
    (``chunk_times`` is not kept); a row that could not be serialized is a failed record.
    Raises KeyError or TypeError on a line that is not a row."""
    if "row_error" in row:
        return RequestRecord(int(row["index"]), "", error=str(row["row_error"]))
    start, latency = float(row["start_s"]), row["latency_s"]
    return RequestRecord(
        index=int(row["index"]), category=str(row["category"]), warmup=bool(row["warmup"]),
        replica=row.get("replica"), scheduled=row.get("scheduled_s"), start=start,
        end=None if latency is None else start + float(latency), ttft=row["ttft_s"],
        itl_runs=[(float(g), int(n)) for g, n in row["itl_runs_s"]],
        prompt_tokens=row["prompt_tokens"], cached_tokens=row.get("cached_tokens"),
        completion_tokens=row["completion_tokens"],
        finish_reason=row["finish_reason"], status=row["status"], error=row["error"],
        responses=list(row["raw"]), spec=row["spec_decode_acceptance"],
        spec_choices=_choices(row.get("spec_decode_choices")),
        spec_status=str(row["spec_decode_status"]), spec_adapter=row["spec_decode_adapter"],
        spec_message=row["spec_decode_message"], unparsable_events=int(row["unparsable_events"]),
        anomalies=list(row["anomalies"]),
    )  # fmt: skip


def _choices(raw: Any) -> dict[int, dict[str, Any]] | None:
    """Per-choice records as written (JSON object keys are strings), keyed by int again."""
    if raw is None:
        return None
    return {int(i): dict(spec) for i, spec in raw.items()}


class Redacts(Protocol):
    """What writes a run's files through: bench's credential redactor (``bench.transport``)."""

    def raw(self, data: bytes) -> bytes: ...


class _Verbatim:
    def raw(self, data: bytes) -> bytes:
        return data


class RecordStream:
    """``records.jsonl``, one line per finished request, written as it finishes.

    Each line goes to the file unbuffered, whole (one ``write`` per line, repeated only for what
    a short write left), so a reader following the run never sees half a line followed by more.

    Opening it is the check that the output directory is writable, done before the first request.
    URL credentials (``redactor``) never reach the file.
    A record that cannot be serialized becomes a line saying so; a write that fails (disk full)
    stops the stream and is kept in ``error`` for the caller to report, never raised mid-run.
    """

    def __init__(self, out_dir: Path, redactor: Redacts | None = None) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "records.jsonl"
        self._fh = open_new(self.path, buffering=0)
        self._redactor: Redacts = redactor or _Verbatim()
        self.count = 0
        self.error: str | None = None

    def write(self, record: RequestRecord) -> None:
        if self.error is not None or self._fh.closed:
            return
        try:
            line = orjson.dumps(record_row(record), option=_JSONL)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            line = orjson.dumps(
                {"index": record.index, "success": False, "row_error": f"{exc}"[:500]}
            )
        try:
            data = memoryview(self._redactor.raw(line) + b"\n")
            while data:
                written = self._fh.write(data)
                if not written:
                    raise OSError(errno.EIO, "the file took no bytes")
                data = data[written:]
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            return
        self.count += 1

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError as exc:
            self.error = self.error or f"{self.path}: {exc.strerror or exc}"

    def __enter__(self) -> RecordStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_JSONL = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def write_files(out_dir: Path, summary: dict[str, Any], records: list[RequestRecord]) -> list[Path]:
    """summary.json, summary.csv, the plots and report.html (records.jsonl is a
    ``RecordStream``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    path = out_dir / "summary.json"
    with open_new(path) as raw:
        raw.write(
            orjson.dumps(
                summary,
                option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            )
        )
    written.append(path)
    path = out_dir / "summary.csv"
    with io.TextIOWrapper(open_new(path), newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["figure", "value"])
        for key, value in _flatten(summary["figures"]):
            writer.writerow(
                [key, value if not isinstance(value, list) else " ".join(map(str, value))]
            )
    written.append(path)
    written += plots(out_dir, summary, records)
    from speclens.runs.html_run import write_run_report

    written.append(write_run_report(out_dir, records))
    return written


def plots(out_dir: Path, summary: dict[str, Any], records: list[RequestRecord]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from speclens.runs.html_plots import integer_ticks, legend_outside

    written: list[Path] = []
    measured = [r for r in records if not r.warmup and r.success]
    acc = summary["figures"]["acceptance"]
    verdict = summary.get("verdict")
    if acc["histogram"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        hist = {int(j): n for j, n in acc["histogram"].items()}
        steps = sum(hist.values())
        xs = sorted(hist)
        ax.bar([x - 0.2 for x in xs], [hist[x] / steps for x in xs], width=0.4, label="observed")
        if verdict:
            expected = {int(j): p for j, p in verdict["expected_distribution"].items()}
            ax.bar(
                [x + 0.2 for x in expected],
                list(expected.values()),
                width=0.4,
                label="forced schedule",
            )
        ticks = set(xs) | ({int(j) for j in verdict["expected_distribution"]} if verdict else set())
        if len(ticks) <= 20:
            ax.set_xticks(sorted(ticks))
        else:
            integer_ticks(ax)
        ax.set_xlabel("accepted drafts per verify step")
        ax.set_ylabel("fraction of verify steps")
        ax.set_title(f"Pooled acceptance histogram ({steps} steps)")
        legend_outside(fig, ax)
        written.append(_save(fig, out_dir / "acceptance_histogram.png"))
    pairs = [
        (al, r.tpot * 1000)
        for r in measured
        if r.spec and r.tpot and _finite(al := r.spec.get("mean_acceptance_length"))
    ]
    if pairs:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([p[1] for p in pairs], [p[0] for p in pairs], s=10)
        ax.set_xlabel("TPOT (ms)")
        ax.set_ylabel("request AL")
        ax.set_title("Acceptance length against time per output token")
        written.append(_save(fig, out_dir / "al_vs_tpot.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, values in (
        ("TTFT", [r.ttft for r in measured]),
        ("TPOT", [r.tpot for r in measured]),
        ("E2E", [r.latency for r in measured]),
    ):
        data = np.sort(np.array([v * 1000 for v in values if _finite(v)], dtype=np.float64))
        if data.size:
            ax.plot(data, np.arange(1, data.size + 1) / data.size, label=name)
            drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_title("Latency CDFs")
        legend_outside(fig, ax)
        written.append(_save(fig, out_dir / "latency_cdf.png"))
    else:
        plt.close(fig)
    return written


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with open_new(path) as fh:
            fig.savefig(fh, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path
