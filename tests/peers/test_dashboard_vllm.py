"""Peer test: the Grafana dashboard's panels return data from a real vLLM 0.32.0's ``/metrics``.

The session's vLLM (n-gram speculation, K 4) is scraped by the same kind of Prometheus the
observability tier starts (``tests/observability/promkit.py``: the deploy configuration re-targeted,
a 2 s scrape), while ``speclens bench`` sends it one Spec-Bench prompt per category. Then every
panel target of ``deploy/grafana/speclens-speculative-decoding.json`` is evaluated through
Prometheus's HTTP API over a window holding the whole run, with ``model_name`` and ``engine``
resolved by the dashboard's own ``label_values`` queries.

Every panel returns data. The three panels whose queries are ``A or B`` show which side vLLM
answers on, each evaluated alone: vLLM has no accepted-count counter (ATOM's
``atom:mtp_decode_steps``) and no decode-step counter (``speclens:decode_steps``), so those panels
fall to their second side, vLLM's per-position counters differenced and its inter-token latency
count; it has a per-request TPOT histogram that speclens serve lacks, so that panel answers on its
first. The observability tier shows speclens serve answering on the other side of each.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from observability.prometheus_env import INSTALL, binaries
from observability.promkit import (
    ANSWERING_SIDE,
    SCRAPE_INTERVAL_S,
    alternatives,
    dashboard_queries,
    finite,
    load_dashboard,
    prometheus_scraping,
    resolve_variables,
    substitute,
)

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
DISTRIBUTION = "Accepted drafts per verify step"
AL_PANEL = "Realized acceptance length"


def _prompts(out: Path) -> Path:
    """The first Spec-Bench prompt of each category (13), as a JSONL file of its own."""
    if not SPEC_BENCH.exists():
        pytest.fail(f"the Spec-Bench prompts are missing: {SPEC_BENCH}")
    first: dict[str, str] = {}
    for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines():
        first.setdefault(json.loads(line)["category"], line)
    out.write_text("\n".join(first.values()) + "\n", encoding="utf-8")
    return out


def _counter(base_url: str, name: str, model: str) -> float:
    """One of vLLM's counters for ``model``, summed over engines, read from ``/metrics``."""
    text = httpx.get(base_url + "/metrics", timeout=10.0).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("model_name") == model
    )


def _one(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_every_panel_returns_data_from_vllm(vllm_server: Any, tmp_path: Path) -> None:
    base_url, model, _model_dir, speculative = vllm_server
    k = speculative["num_speculative_tokens"]
    found = binaries()
    if found is None:
        pytest.fail(f"prometheus is not installed: run `make test-observability` or {INSTALL}")
    dashboard = load_dashboard()
    queries = dashboard_queries(dashboard)
    target = urlparse(base_url).netloc
    drafts = "vllm:spec_decode_num_drafts_total"
    accepted = "vllm:spec_decode_num_accepted_tokens_total"
    with prometheus_scraping(found[0], [target], tmp_path / "prometheus") as prom:
        started = time.monotonic()
        before = {name: _counter(base_url, name, model) for name in (drafts, accepted)}
        done = subprocess.run(
            [
                *(sys.executable, "-m", "speclens", "bench", "--url", base_url, "--model", model),
                *("--dataset", "jsonl", "--dataset-path", str(_prompts(tmp_path / "p.jsonl"))),
                *("--num-requests", "13", "--concurrency", "4", "--max-tokens", "64"),
                *("--temperature", "0", "--output-dir", str(tmp_path / "bench")),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        after = {name: _counter(base_url, name, model) for name in (drafts, accepted)}
        assert after[drafts] > before[drafts], (before, after)
        # Until Prometheus holds the run's last counts.
        sel = f'{{model_name="{model}"}}'
        deadline = time.monotonic() + 10 * SCRAPE_INTERVAL_S
        while _one(prom.query(f"sum({drafts}{sel})")) != after[drafts]:
            assert time.monotonic() < deadline, "Prometheus never scraped the run's last counts"
            time.sleep(0.5)
        window = f"{math.ceil(time.monotonic() - started) + 2 * SCRAPE_INTERVAL_S}s"
        values = resolve_variables(prom, dashboard, {"__rate_interval": window, "forced_al": "NaN"})
        at = time.time()
        answers, sides = {}, {}
        for q in queries:
            expr = substitute(q.expr, values)
            answers[q.panel, q.ref] = prom.query(expr, at)
            parts = alternatives(expr)
            if len(parts) > 1:
                sides[q.panel, q.ref] = [prom.query(part, at) for part in parts]

    assert values["model_name"] == model and values["engine"] == "0", values
    table = []
    for q in queries:
        result = answers[q.panel, q.ref]
        if q.panel == DISTRIBUTION and int(q.legend.split()[0]) > k:
            assert result == [], (q, result)  # no counts above K
            continue
        assert result, f"{q.panel} {q.ref} returned no data from vLLM: {q.expr}"
        if (q.panel, q.ref) in sides:
            answered = [i for i, side in enumerate(sides[q.panel, q.ref]) if side]
            table.append((q.panel, q.ref, answered))
            expected = ANSWERING_SIDE["vllm"][q.panel]
            # The first side answers on one engine only: here where speclens's does not.
            assert answered and answered[0] == expected, (q, answered)
            assert expected != ANSWERING_SIDE["speclens"][q.panel]
            assert result == sides[q.panel, q.ref][expected]
        if q.panel == AL_PANEL and q.ref == "B":
            assert math.isnan(_one(result))  # vLLM publishes no forced target: no line
            continue
        assert len(finite(result)) == len(result), (q, result)
    print("vLLM answers the two-sided queries on operand (0 = first, 1 = after `or`):")
    for panel, ref, answered in table:
        print(f"  {panel} {ref}: {answered}")
    assert {panel for panel, _, _ in table} == set(ANSWERING_SIDE["vllm"])

    # The realized-AL panel over the whole run is vLLM's own count ratio.
    al = _one(answers[AL_PANEL, "A"])
    delta = {name: after[name] - before[name] for name in (drafts, accepted)}
    assert al == pytest.approx(1 + delta[accepted] / delta[drafts], rel=1e-6), (al, delta)
    counts = [q for q in queries if q.panel == DISTRIBUTION][: k + 1]
    shares = [_one(answers[DISTRIBUTION, q.ref]) for q in counts]
    print(f"realized AL {al:.4f}; verify steps accepting 0..{k} drafts: {shares}")
    assert all(s >= -1e-9 for s in shares) and sum(shares) == pytest.approx(1.0, abs=0.02)
