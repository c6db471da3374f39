"""report.html for an aggregate-only run: a published result, or a prediction of one."""

from __future__ import annotations

import re
from typing import Any

from speclens.runs.html import (
    Fields,
    Page,
    esc,
)

#: The line an aggregate-only page shows where per-request plots would be.
AGGREGATE_LINE = "aggregate-only: published figures, no per-request data"
_SAFE_URL = re.compile(r"https?://[^\s\"'<>]{1,2000}\Z")


def aggregate_page(summary: dict[str, Any]) -> Page:
    """An aggregate-only run (a published result, or a prediction of one): its settings, its
    provenance (the run's URL as a plain link: the page fetches nothing), the published
    figures, and no plot that needs per-request rows. Its throughputs are the published ones,
    each named: output tokens first (what every decision reads), then input + output."""
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
        ("output throughput per GPU (tok/s/GPU)", f.num(*t, "output_tokens_per_s_per_gpu", digits=1)),
        ("output throughput (tok/s)", f.num(*t, "output_tokens_per_s", digits=1)),
        ("total throughput per GPU, input + output (tok/s/GPU)",
         f.num(*t, "total_tokens_per_s_per_gpu", digits=1)),
        ("total throughput, input + output (tok/s)", f.num(*t, "total_tokens_per_s", digits=1)),
        ("interactivity, median (tok/s/user)", f.num(*i, "p50", digits=2)),
        ("interactivity, mean (tok/s/user)", f.num(*i, "mean", digits=2)),
        ("acceptance length", f.num("figures", "acceptance", "acceptance_length", digits=4)),
    ])  # fmt: skip
    page.heading("Plots")
    page.note(esc(AGGREGATE_LINE) + ": no latency CDF, histogram or per-request plot")
    return page
