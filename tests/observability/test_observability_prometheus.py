"""Every panel of the Grafana dashboard, through a real Prometheus scraping a forced speclens serve.

One forced run serves the module: ``speclens serve`` on the dummy model with K 7 and a forced
acceptance length of 3.78, scraped every 2 s by Prometheus (the deploy configuration with its
target and interval replaced), under ``speclens bench`` load. While the load runs, every
``SAMPLE_EVERY_S`` seconds, every panel target is evaluated through ``/api/v1/query`` with the
dashboard's variables filled in as Grafana fills them (``model_name`` and ``engine`` from their
``label_values`` queries, ``$__rate_interval`` four scrape intervals, ``forced_al`` NaN: the
target line is the server's own gauge), and ``/debug/mtp_stats`` is read right after. The last
samples also evaluate every target over a window reaching back to before the load (a dashboard
showing the whole run). Everything is stopped before the tests look at the samples, and one test
checks that no process is left.

The realized-AL tolerance. A verify step accepts ``X`` drafts, independently from step to step;
the panel over a window of ``n`` steps estimates ``1 + mean(X)``, and ``/debug/mtp_stats`` the
same over all ``N`` steps so far, of which the window's are a part. The difference of the two
means has variance ``s² (1/n - 1/N)``, ``s²`` the variance of ``X`` (read from mtp_stats's
accepted-count distribution: 0.78 x 0.22 for the forced schedule, whose steps accept 2 or 3).
The panel must sit within ``Z = 4`` such standard errors of mtp_stats (a false alarm about once in
16,000 comparisons); ``n`` is the window's own step count (last minus first scraped count of
``vllm:spec_decode_num_drafts_total`` in it). To call the panel "3.78 +- 0.05", 0.05 must be at
least four standard errors of its window, ``n >= (4 s / 0.05)²`` (about 1,100 steps): that claim
is checked on the whole-run windows, and the test fails, saying so, when the run was too slow to
make that many steps.

Prometheus's ``rate`` extrapolates each series to the window's edges, limited at the point where
the counter would reach zero, so a ratio of two rates equals the ratio of the counts only when
that limit cuts both alike: it does once the load began a window before (``WARM_S``), and on
windows that start before the load, where every counter starts at zero. The exact identities
between panels (accepted over drafted = (AL - 1) / K; ATOM's distribution = vLLM's per-position
counters differenced) are checked on the whole-run windows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from promkit import (
    ANSWERING_SIDE,
    RATE_INTERVAL,
    SCRAPE_INTERVAL_S,
    Prometheus,
    Query,
    alternatives,
    dashboard_queries,
    finite,
    load_dashboard,
    prometheus_scraping,
    resolve_variables,
    substitute,
)

import launch
from serverkit import AL, FORCED, K, child_env, mtp_stats, running_server, wait_until

pytestmark = pytest.mark.timeout(240)

#: Seconds of load ``speclens bench --duration`` sends.
LOAD_S = 36
#: Seconds into the load before the first sample: more than the rate window, so the window holds
#: load only and every counter in it started before it.
WARM_S = 12.0
SAMPLE_EVERY_S = 2.0
#: The samples this close to the end of the load also evaluate the whole-run window.
WHOLE_RUN_LAST_S = 12.0
Z = 4.0
TARGET_TOLERANCE = 0.05

AL_PANEL = "Realized acceptance length"
POSITIONS = "Acceptance by draft position"
DISTRIBUTION = "Accepted drafts per verify step"
TOKENS_PER_STEP = "Tokens per decode step"
TPOT = "Time per output token"
DRAFTS = 'vllm:spec_decode_num_drafts_total{model_name=~"$model_name", engine=~"$engine"}'
#: ``tests/peers/test_dashboard_vllm.py`` shows vLLM answering on the other side of each.
SPECLENS_SIDE = ANSWERING_SIDE["speclens"]

Result = list[dict[str, Any]]


@dataclass
class Evaluation:
    """Every panel target at one instant over one window (``$__rate_interval``)."""

    window: str
    answers: dict[tuple[str, str], Result]
    #: For the queries with an ``or``: each operand evaluated alone.
    sides: dict[tuple[str, str], list[Result]]
    #: Verify steps in the window: last minus first scraped count inside it.
    steps: float

    def value(self, panel: str, ref: str = "A") -> float:
        return _one(self.answers[panel, ref])


@dataclass
class Sample:
    elapsed: float
    short: Evaluation
    whole_run: Evaluation | None
    mtp: dict[str, Any]
    took_s: float


@dataclass
class ForcedRun:
    samples: list[Sample]
    values: dict[str, str]
    queries: list[Query]
    pids: list[int]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def whole_run(self) -> list[tuple[Sample, Evaluation]]:
        return [(s, s.whole_run) for s in self.samples if s.whole_run is not None]


def _one(result: Result) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def _evaluate(
    prom: Prometheus, queries: list[Query], values: dict[str, str], window: str, at: float
) -> Evaluation:
    values = values | {"__rate_interval": window}
    answers, sides = {}, {}
    for q in queries:
        expr = substitute(q.expr, values)
        answers[q.panel, q.ref] = prom.query(expr, at)
        parts = alternatives(expr)
        if len(parts) > 1:
            sides[q.panel, q.ref] = [prom.query(part, at) for part in parts]
    steps_expr = f"sum(max_over_time({DRAFTS}[{window}]) - min_over_time({DRAFTS}[{window}]))"
    steps = _one(prom.query(substitute(steps_expr, values), at))
    return Evaluation(window, answers, sides, steps)


def _sample(
    prom: Prometheus, base: str, queries: list[Query], values: dict[str, str], elapsed: float
) -> Sample:
    at, started = time.time(), time.monotonic()
    short = _evaluate(prom, queries, values, RATE_INTERVAL, at)
    whole_run = None
    if elapsed >= LOAD_S - WHOLE_RUN_LAST_S:
        # From before the first verify step: two scrape intervals of margin.
        window = f"{math.ceil(elapsed) + 2 * SCRAPE_INTERVAL_S}s"
        whole_run = _evaluate(prom, queries, values, window, at)
    mtp = mtp_stats(base)
    return Sample(elapsed, short, whole_run, mtp, time.monotonic() - started)


@pytest.fixture(scope="module")
def forced_run(
    prometheus_bin: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ForcedRun]:
    tmp = tmp_path_factory.mktemp("observability")
    dashboard = load_dashboard()
    queries = dashboard_queries(dashboard)
    timings: dict[str, float] = {}
    started = time.monotonic()
    samples: list[Sample] = []
    with running_server(tmp / "server", *FORCED) as server:
        timings["server_ready_s"] = time.monotonic() - started
        with prometheus_scraping(prometheus_bin[0], [f"127.0.0.1:{server.port}"], tmp) as prom:
            timings["prometheus_ready_s"] = time.monotonic() - started
            values = resolve_variables(
                prom, dashboard, {"__rate_interval": RATE_INTERVAL, "forced_al": "NaN"}
            )
            cmd = [
                *(sys.executable, "-m", "speclens", "bench", "--url", server.url),
                *("--model", "dummy", "--duration", str(LOAD_S), "--concurrency", "16"),
                *("--max-tokens", "128", "--ignore-eos", "--output-dir", str(tmp / "bench")),
            ]
            with open(tmp / "bench.log", "wb") as log:
                bench = launch.popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
            try:
                # The load starts with the first verify step, not with the command.
                if not wait_until(lambda: mtp_stats(server.url)["total_draft_tokens"], 60):
                    pytest.fail(f"no verify step: {(tmp / 'bench.log').read_text()[-3000:]}")
                load_start = time.monotonic()
                due = load_start + WARM_S
                while bench.poll() is None:
                    time.sleep(max(0.0, due - time.monotonic()))
                    elapsed = time.monotonic() - load_start
                    # bench's own clock started before the first step: stop sampling while the
                    # rate window still holds new requests (their TTFT).
                    if elapsed <= LOAD_S - 3:
                        samples.append(_sample(prom, server.url, queries, values, elapsed))
                    due += SAMPLE_EVERY_S
                bench_rc = bench.wait(timeout=120)
            finally:
                if bench.poll() is None:
                    bench.send_signal(signal.SIGKILL)
                    bench.wait(timeout=30)
            timings["load_s"] = time.monotonic() - load_start
            assert prom.proc is not None
            pids = [server.pid, bench.pid, prom.proc.pid]
    timings["total_s"] = time.monotonic() - started
    (tmp / "samples.json").write_text(
        json.dumps(_jsonable([dataclasses.asdict(s) for s in samples])), encoding="utf-8"
    )
    took = ", ".join(f"{s.elapsed:.0f}+{s.took_s:.1f}" for s in samples)
    print(
        f"forced run: {len(samples)} samples (at s + took s: {took}); timings {timings}; in {tmp}"
    )
    if bench_rc != 0:
        pytest.fail(f"speclens bench exited {bench_rc}:\n{(tmp / 'bench.log').read_text()[-3000:]}")
    yield ForcedRun(samples, values, queries, pids, timings)


def _jsonable(value: Any) -> Any:
    """``value`` with tuple keys joined, for the samples file a failing run leaves behind."""
    if isinstance(value, dict):
        return {
            " / ".join(k) if isinstance(k, tuple) else k: _jsonable(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _accepted_sd(mtp: dict[str, Any]) -> tuple[float, int]:
    """The sample standard deviation of drafts accepted per verify step, and the step count."""
    counts = {int(j): n for j, n in mtp["distribution"].items()}
    n = sum(counts.values())
    mean = sum(j * c for j, c in counts.items()) / n
    var = sum(c * (j - mean) ** 2 for j, c in counts.items()) / (n - 1)
    return math.sqrt(var), n


def _count(q: Query) -> int:
    """The accepted count a distribution target is for (its legend reads "j accepted")."""
    return int(q.legend.split()[0])


def test_the_variables_resolve_to_the_served_model_and_engine(forced_run: ForcedRun) -> None:
    assert forced_run.values["model_name"] == "dummy"
    assert forced_run.values["engine"] == "0"
    assert len(forced_run.samples) >= 8, forced_run.timings
    assert len(forced_run.whole_run) >= 3, forced_run.timings


def test_every_panel_returns_data(forced_run: ForcedRun) -> None:
    """Every target answers in every sample taken under load, and with finite values over the
    whole run; the distribution's targets answer for the K + 1 possible counts and no others.
    (A latency quantile over a short window without a new request reads NaN, as Grafana shows
    it: on this slow a machine requests start in waves.)"""
    for sample in forced_run.samples:
        for q in forced_run.queries:
            result = sample.short.answers[q.panel, q.ref]
            if q.panel == DISTRIBUTION and _count(q) > K:
                assert result == [], (q, result)
                continue
            assert result, f"{q.panel} {q.ref}: no data at {sample.elapsed:.0f} s: {q.expr}"
    last = forced_run.whole_run[-1][1]
    for q in forced_run.queries:
        result = last.answers[q.panel, q.ref]
        assert len(finite(result)) == len(result), (q, result)


def test_the_realized_al_panel_agrees_with_mtp_stats_within_its_standard_error(
    forced_run: ForcedRun,
) -> None:
    checked = 0
    for sample in forced_run.samples:
        sd, total = _accepted_sd(sample.mtp)
        mtp_al = sample.mtp["average_tokens_per_forward"]
        for evaluation in (sample.short, sample.whole_run):
            if evaluation is None:
                continue
            al, n = evaluation.value(AL_PANEL), evaluation.steps
            assert 0 < n <= total, (n, total)
            se = sd * math.sqrt(max(1.0 / n - 1.0 / total, 0.0))
            assert abs(al - mtp_al) <= Z * se + 1e-9, (
                f"panel {al:.4f} over {n:.0f} steps ({evaluation.window}) vs mtp_stats "
                f"{mtp_al:.4f} over {total}: |diff| {abs(al - mtp_al):.4f} > {Z:.0f} x SE "
                f"{se:.4f} at {sample.elapsed:.0f} s"
            )
            checked += 1
    assert checked == len(forced_run.samples) + len(forced_run.whole_run)


def test_the_realized_al_panel_reads_the_forced_target(forced_run: ForcedRun) -> None:
    """3.78 +- 0.05 over the whole run wherever 0.05 is at least four standard errors (the last
    sample must be such a one); the target line reads 3.78."""
    resolved = []
    for sample, evaluation in forced_run.whole_run:
        assert evaluation.value(AL_PANEL, "B") == AL
        sd, _ = _accepted_sd(sample.mtp)
        needed = (Z * sd / TARGET_TOLERANCE) ** 2
        if evaluation.steps >= needed:
            assert abs(evaluation.value(AL_PANEL) - AL) <= TARGET_TOLERANCE, sample.elapsed
            resolved.append(sample.elapsed)
    last, evaluation = forced_run.whole_run[-1]
    assert resolved and resolved[-1] == last.elapsed, (
        f"only {evaluation.steps:.0f} verify steps in {last.elapsed:.0f} s of load: "
        f"{needed:.0f} are needed to resolve +-{TARGET_TOLERANCE} at {Z:.0f} standard errors"
    )
    assert abs(forced_run.samples[-1].mtp["average_tokens_per_forward"] - AL) <= TARGET_TOLERANCE


def test_acceptance_by_position_follows_the_forced_schedule(forced_run: ForcedRun) -> None:
    """[1, 1, 0.78, 0, 0, 0, 0]: the certain positions exactly, position 2 within Z binomial
    standard errors of its window."""
    for sample in forced_run.samples:
        evaluation = sample.short
        by_position = {
            int(r["metric"]["position"]): float(r["value"][1])
            for r in evaluation.answers[POSITIONS, "A"]
        }
        assert sorted(by_position) == list(range(K))
        assert by_position[0] == pytest.approx(1.0) and by_position[1] == pytest.approx(1.0)
        assert all(by_position[p] == 0.0 for p in range(3, K))
        se = math.sqrt(0.78 * 0.22 / evaluation.steps)
        assert abs(by_position[2] - 0.78) <= Z * se, (by_position[2], evaluation.steps)


def test_the_accepted_count_distribution_is_the_same_both_ways(forced_run: ForcedRun) -> None:
    """ATOM's counter and vLLM's per-position counters differenced give the same shares, which
    sum to 1, fall on 2 and 3 only, and make the realized AL."""
    for _, evaluation in forced_run.whole_run:
        shares = {}
        for q in forced_run.queries:
            if q.panel != DISTRIBUTION or _count(q) > K:
                continue
            atom, from_positions = evaluation.sides[q.panel, q.ref]
            shares[_count(q)] = _one(atom)
            assert _one(from_positions) == pytest.approx(_one(atom), abs=1e-9), q.legend
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
        assert {j for j, v in shares.items() if v > 0} == {2, 3}
        al = evaluation.value(AL_PANEL)
        assert 1 + sum(j * v for j, v in shares.items()) == pytest.approx(al, abs=1e-9)


def test_rate_and_tokens_per_step_agree_with_the_al(forced_run: ForcedRun) -> None:
    for _, evaluation in forced_run.whole_run:
        al = evaluation.value(AL_PANEL)
        # Every forced step drafts all K, so accepted / drafted = (AL - 1) / K exactly.
        assert evaluation.value("Draft acceptance rate") == pytest.approx((al - 1) / K, rel=1e-9)
        # Each decode step emits its accepted drafts plus one, except a request's last step, cut
        # at --max-tokens: about 1.4 tokens lost over 34 steps of a 128-token request.
        tokens_per_step = evaluation.value(TOKENS_PER_STEP)
        assert al - 0.15 <= tokens_per_step <= al + 1e-9, (tokens_per_step, al)
        assert evaluation.value("Output tokens/s") > 0


def test_latency_quantiles_are_ordered(forced_run: ForcedRun) -> None:
    for _, evaluation in forced_run.whole_run:
        for panel in ("Time to first token", TPOT):
            p50, p90, p99 = (evaluation.value(panel, ref) for ref in "ABC")
            assert 0 < p50 <= p90 <= p99, (panel, evaluation.window, p50, p90, p99)


def test_the_or_queries_answer_on_the_speclens_side(forced_run: ForcedRun) -> None:
    last = forced_run.samples[-1].short
    two_sided = [q for q in forced_run.queries if (q.panel, q.ref) in last.sides]
    assert {q.panel for q in two_sided} == set(SPECLENS_SIDE)
    for q in two_sided:
        if q.panel == DISTRIBUTION and _count(q) > K:
            continue
        sides = last.sides[q.panel, q.ref]
        answered = [i for i, side in enumerate(sides) if side]
        assert answered and answered[0] == SPECLENS_SIDE[q.panel], (q, answered)
        assert last.answers[q.panel, q.ref] == sides[SPECLENS_SIDE[q.panel]]
    print("speclens serve answers the two-sided queries with operand:", SPECLENS_SIDE)


def test_no_process_is_left_running(forced_run: ForcedRun) -> None:
    for pid in forced_run.pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
