"""The simulator's run in bench's run format: one ``RequestRecord`` per simulated request, and a
``summary.json`` built by the same ``speclens.runs.figures.summarize`` a measured run's is, so
``compare``, ``merge`` and the reports read a prediction as they read a measurement.

Times are virtual seconds from the run's first arrival. A record carries what bench would have
seen on the wire: start (the arrival), TTFT, inter-token gaps, finish, tokens, and the request's
acceptance as an engine-neutral ``SpecDecodeAcceptanceRecord`` (validated as every adapter's is).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speclens.acceptance import AcceptanceHistogram
from speclens.runs.figures import summarize
from speclens.runs.record import SpecDecodeAcceptanceRecord
from speclens.runs.report import RecordStream, write_files
from speclens.runs.request import RequestRecord, RunResult

if TYPE_CHECKING:
    from speclens.runs.sweep import Sweep
    from speclens.sim.fast import Trace
    from speclens.sim.request import SimRequest
    from speclens.sim.scenario import Lengths, Scenario

#: The category of a request whose workload names none.
DEFAULT_CATEGORY = "default"
#: What a simulated request's acceptance record names as its engine, and the adapter that
#: "detected" it: a reader tells a prediction from a measurement by either.
ENGINE = "speclens-sim"
ADAPTER = "sim"
#: Most request-steps (requests x the longest output) held at once by a run with
#: ``--output-dir``: a point keeps its inter-token gaps until its files are written (about 100
#: bytes a decode step in memory, 25 in records.jsonl), so one point may take at most this many,
#: and a sweep keeps only as many points in flight as fit in it (``points_in_flight``).
MAX_RECORDED_REQUEST_STEPS = 2_000_000


def spec_record(k: int, drafting: np.ndarray, accepted: np.ndarray) -> dict[str, Any] | None:
    """One request's acceptance from its decode steps (whether each drafted, and the drafts
    each accepted), as bench keeps it; None when the replica does not speculate."""
    if not k:
        return None
    drafted = np.asarray(drafting, dtype=bool)
    counts = np.asarray(accepted, dtype=np.int64)[drafted]
    return _spec(
        k,
        AcceptanceHistogram.from_dense(np.bincount(counts, minlength=k + 1).tolist()),
        int(drafted.size),
        int(drafted.sum()) * k,
    )


def _spec(k: int, hist: AcceptanceHistogram, decode_steps: int, drafts: int) -> dict[str, Any]:
    record = SpecDecodeAcceptanceRecord(
        engine=ENGINE,
        mean_acceptance_length=hist.acceptance_length,
        draft_acceptance_rate=hist.num_accepted / drafts if drafts else 0.0,
        acceptance_histogram=dict(hist.counts),
        num_accepted_draft_tokens=hist.num_accepted,
        num_draft_tokens=drafts,
        num_spec_steps=hist.num_steps,
        num_spec_tokens=k,
        num_decode_steps=decode_steps,
        draft_unit="tokens",
    )
    return record.model_dump()


def _record(
    index: int,
    category: str,
    replica: str,
    times: tuple[float, float, float],
    tokens: tuple[int, int],
    itl_runs: list[tuple[float, int]],
    spec: dict[str, Any] | None,
) -> RequestRecord:
    arrival, first, finish = times
    return RequestRecord(
        index=index, category=category, replica=replica, start=arrival, end=finish,
        ttft=first - arrival, itl_runs=itl_runs, prompt_tokens=tokens[0],
        completion_tokens=tokens[1], finish_reason="length", status=200, spec=spec,
        spec_status="ok" if spec is not None else "absent",
        spec_adapter=ADAPTER if spec is not None else None,
    )  # fmt: skip


def from_trace(trace: Trace, k: int, category: str, replica: str) -> RequestRecord:
    """A request the fast path finished. Its first decode step's gap runs from the prefill's
    token, each later one from the step before, over the tokens it emitted (as the fast
    path's own ITL samples are drawn)."""
    ends = trace.step_times
    previous = np.concatenate([[trace.first], ends[:-1]])
    itl = [
        (gap / n, n)
        for gap, n in zip((ends - previous).tolist(), trace.emitted.tolist(), strict=True)
    ]
    finish = float(ends[-1]) if ends.size else trace.first
    return _record(
        trace.index, category, replica, (trace.arrival, trace.first, finish),
        (trace.input_tokens, trace.output_tokens), itl,
        spec_record(k, trace.drafting, trace.accepted),
    )  # fmt: skip


def from_exact(request: SimRequest, k: int, category: str, replica: str) -> RequestRecord:
    """A request the step-exact loop finished: its token times as the engine emitted them, its
    acceptance as the engine counted it."""
    runs = [((now - then) / n, n) for (then, _), (now, n) in pairwise(request.token_times)]
    first = request.first_token if request.first_token is not None else math.nan
    finish = request.finish if request.finish is not None else math.nan
    acc = request.acceptance
    spec = None
    if k and acc is not None:
        spec = _spec(k, acc.histogram, acc.num_decode_steps, acc.num_draft_tokens)
    return _record(
        request.index, category, replica, (request.arrival, first, finish),
        (request.input_tokens, request.output_tokens), runs, spec,
    )  # fmt: skip


def summary(
    records: Sequence[RequestRecord],
    makespan: float,
    settings: dict[str, Any],
    server: dict[str, Any],
    simulation: dict[str, Any],
    trust: dict[str, Any] | None = None,
    slo: dict[str, float] | None = None,
) -> dict[str, Any]:
    """summary.json in bench's shape: the figures from ``summarize`` over the records, timed by
    the simulated makespan (first arrival to last finish, as ``speclens sim`` divides by); the
    latencies and the goodput under ``slo`` (seconds by metric), as sim's, leave out the
    warm-up ``simulation["warmup"]`` names (the first requests by index). ``trust``
    (``run_trust``'s) goes in ``provenance.trust``, where a published replay's prediction keeps
    it too."""
    result = RunResult(list(records), started=0.0, duration=makespan)
    sent = len(records)
    figures = summarize(result)
    warm = (simulation.get("warmup") or {}).get("requests", 0)
    measured = [r for r in records if r.index >= warm] if warm else list(records)
    if warm or slo:
        kept = summarize(RunResult(measured, 0.0, makespan), slo)
        figures["latency_ms"] = kept["latency_ms"]
        if slo:
            figures["goodput"] = kept["goodput"]
    figures["throughput"].update(_deployment_throughput(figures, settings.get("gpus")))
    return {
        "settings": settings,
        "server": server,
        "figures": figures,
        "server_check": {
            "available": False,
            "unreadable_after": False,
            "note": "simulated: no server counters to check against",
        },
        "failures": {"failed": 0, "sent": sent, "rate": 0.0, "max_rate": 0.0,
                     "exceeded": False, "first_errors": []},
        "load": {"started": 0.0, "sending_s": makespan, "in_flight_at_stop": 0},
        "simulation": {k: v for k, v in simulation.items() if k != "trust"},
        "provenance": {"trust": trust},
        "warnings": [],
    }  # fmt: skip


#: Said where a statement's TTFT figure was scored with a front latency the run does not add.
NO_FRONT_LATENCY = (
    "; its TTFT figure was scored with a fitted client front latency added (the wait before "
    "the engine sees a request), which this prediction does not add: its TTFT reads low by "
    "that wait, so expect more TTFT error than stated"
)


def pool_trust(
    scenario: Scenario, base: Path, index: int, speculating: bool, front_added: bool = False,
    widths: tuple[int, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """How far to trust the figures of pool ``index`` (``speclens.sim.trust.for_pricing`` on how
    its steps are priced: its cost file's fit where it names one), as ``Trust.as_dict`` gives
    it; ``speculating``: the pool runs speculation here; ``front_added``: the prediction adds
    the fit's front latency (a scenario's run adds none: its line then says TTFT reads low)."""
    from speclens.acceptance.files import inside
    from speclens.sim.calibrate import read_cost_file
    from speclens.sim.scenario import cost_source, pool_cost

    pool = scenario.deployment.pools[index]
    pricing = {**pool_cost(pool, base, scenario, index=index).describe(),
               "source": cost_source(pool, scenario)}  # fmt: skip
    meta = None
    if pool.step_cost is None and pool.step_cost_file is not None:
        name = pool.step_cost_file
        path = inside(base, name, "step_cost_file", str(base / name))
        meta = read_cost_file(path)[1]
        pricing["source"] = f"from {path}"
    disaggregated = any(p.role == "prefill" for p in scenario.deployment.pools)
    out = priced_trust(pricing, meta, speculating, front_added, disaggregated)
    notes = _extrapolating(pool, base, scenario, index, meta, pricing, widths, disaggregated)
    if notes:
        out["line"] = out["line"] + "; " + "; ".join(notes)
        out["notes"] = notes
    return out


def _extrapolating(pool: Any, base: Path, scenario: Scenario, index: int,
                   meta: dict[str, Any] | None, pricing: dict[str, Any],
                   widths: tuple[int, int] | None, disaggregated: bool) -> list[str]:  # fmt: skip
    """Where the run's concurrencies (``widths``; else the workload's) lie past what its prices
    were fitted on: a cost file's fitted batches, a chip's catalog defaults' ``fitted_on``."""
    from speclens.sim.calibrate import defaults_extrapolation, extrapolation
    from speclens.sim.scenario import pool_cost

    if widths is None:
        c = scenario.workload.concurrency
        if c is None:
            return []
        widths = (c, c)
    if meta is not None:
        note = extrapolation(meta, widths)
        return [note] if note else []
    if pricing.get("kind") == "roofline" and pricing.get("efficiency_source") == "chip":
        cost = pool_cost(pool, base, scenario, index=index)
        return defaults_extrapolation(getattr(cost, "chip", None), widths, disaggregated)
    return []


def priced_trust(
    pricing: dict[str, Any], meta: dict[str, Any] | None, speculating: bool, front_added: bool,
    disaggregated: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """``speclens.sim.trust.for_pricing``'s statement as ``Trust.as_dict`` gives it (a
    ``disaggregated`` deployment's: scored on disaggregated runs), its line saying where TTFT
    reads low: the figure was scored with a front latency this prediction does not add
    (``front_added`` False)."""
    from speclens.sim import trust

    said = trust.for_pricing(pricing, meta, speculating, disaggregated=disaggregated)
    out = said.as_dict()
    if said.expected is not None and not front_added:
        out["line"] = said.line + NO_FRONT_LATENCY
    return out


def run_trust(scenario: Scenario, base: Path, k: int | None,
              widths: tuple[int, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """How far to trust a run of ``scenario`` at K ``k`` (0 or None: no speculation) at the
    concurrencies ``widths`` (else the workload's): each pool's statement (``pool_trust``), one
    for the run (``combined``)."""
    pools = scenario.deployment.pools
    speculating = [bool(k) and pool.engine.speculative is not None for pool in pools]
    return combined([(f"pool {i}", pool_trust(scenario, base, i, speculating[i],
                                              widths=widths))
                     for i in range(len(pools))])  # fmt: skip


def combined(said: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One statement for figures that rest on several (each ``(label, Trust.as_dict())``: the
    pools of a run, the Ks of a schedule): the statement itself where all agree; else each
    line labelled, and as the expected error each figure's largest (none where one is
    unmeasured): a figure is only as trustworthy as the least trusted price behind it."""
    distinct = list({_key(d): d for _, d in said}.values())
    if len(distinct) == 1:
        return distinct[0]
    errors = [d.get("expected_error") for _, d in said]
    expected = None
    if all(isinstance(e, dict) for e in errors):
        expected = {name: max(float(e[name]) for e in errors if isinstance(e, dict))
                    for name in ("tpot", "ttft", "throughput")}  # fmt: skip
    chips = {d.get("chip") for _, d in said}
    return {
        "basis": "combined", "chip": chips.pop() if len(chips) == 1 else None,
        "expected_error": expected, "own_error": None,
        "source": next((d.get("source") for _, d in said if d.get("source")), None),
        "line": "; ".join(f"{label}: {d['line']}" for label, d in said),
        "parts": {label: d for label, d in said},
    }  # fmt: skip


def _key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def _deployment_throughput(figures: dict[str, Any], gpus: object) -> dict[str, float]:
    """What a published run states of its deployment's throughput: total (prompt and output)
    tokens/s over the run, and output and total per GPU where its GPUs are known (``compare``
    reads a pair with a published run on total tokens/s per GPU)."""
    throughput, duration = figures["throughput"], figures["duration_s"]
    if not duration or duration <= 0:
        return {}
    total = (throughput["total_output_tokens"] + throughput["total_prompt_tokens"]) / duration
    out = {"total_tokens_per_s": total}
    if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
        out |= {"output_tokens_per_s_per_gpu": throughput["output_tokens_per_s"] / gpus,
                "total_tokens_per_s_per_gpu": total / gpus}  # fmt: skip
    return out


def write_run(
    stream: RecordStream, summary_json: dict[str, Any], records: Sequence[RequestRecord]
) -> list[Path]:
    """records.jsonl through ``stream`` (bench's ``RecordStream``, opened before the run as the
    check that its directory is writable), then summary.json, summary.csv and the plots
    (``write_files``) beside it. Raises OSError naming the file it could not write."""
    with stream:
        for record in records:
            stream.write(record)
    if stream.error:
        raise OSError(stream.error)
    return [stream.path, *write_files(stream.path.parent, summary_json, list(records))]


#: Every file a run directory gets (``write_run``): each is refused up front when it is a link
#: or not a regular file, so a bad directory fails before the simulation, not after it.
RUN_FILES = ("records.jsonl", "summary.json", "summary.csv", "acceptance_histogram.png",
             "al_vs_tpot.png", "latency_cdf.png", "report.html")  # fmt: skip


#: The files ``sim --context --output-dir`` writes: the schedule and its page.
SCHEDULE_FILES = ("k_schedule.json", "report.html")


def output_problem(out_dir: Path, files: Sequence[str] = RUN_FILES) -> str | None:
    """Why ``out_dir`` cannot take a run's files (``files``; one line naming the option), or
    None."""
    where = f"command line: --output-dir: {str(out_dir)!r}"
    if out_dir.exists() and not out_dir.is_dir():
        return f"{where}: is not a directory, expected a directory to write the run into"
    for name in files:
        path = out_dir / name
        if path.is_symlink():
            return f"{where}: {name} is a symbolic link (never written through)"
        if path.exists() and not path.is_file():
            return f"{where}: {name} is not a regular file"
    return None


def recorded_steps_problem(requests: int, longest_output: int) -> str | None:
    """Why one point of a run with ``--output-dir`` would keep too much (its per-request gaps),
    or None."""
    steps = requests * longest_output
    if steps <= MAX_RECORDED_REQUEST_STEPS:
        return None
    return (
        f"command line: --output-dir: {requests:,} requests x up to {longest_output:,} output "
        f"tokens = {steps:,} request-steps, over the {MAX_RECORDED_REQUEST_STEPS:,} a run "
        "keeps per request for its records: lower workload.requests or workload.output_tokens, "
        "or drop --output-dir"
    )


def points_in_flight(requests: int, longest_output: int, workers: int) -> int:
    """How many sweep points may be simulated or awaiting their files at once, so that the
    records held stay within ``MAX_RECORDED_REQUEST_STEPS`` (at least one)."""
    per_point = max(1, requests * longest_output)
    return max(1, min(workers, MAX_RECORDED_REQUEST_STEPS // per_point))


def run_settings(
    scenario: Scenario,
    source: str,
    seed: int,
    concurrency: int | None,
    num_spec_tokens: int | None,
    row: dict[str, Any],
) -> dict[str, Any]:
    """summary.json's ``settings`` for a simulated run: bench's keys where they mean the same
    (the load, the lengths, sampling: greedy, ignoring EOS as the simulator does), and what
    says it was simulated (``executor``, the scenario file, the seed, the loop that ran)."""
    from speclens.runs.rundir import SETTINGS_SCHEMA

    workload = scenario.workload
    closed = concurrency or workload.concurrency
    outputs = workload.output_tokens
    resolution = row.get("resolution")
    resolution = resolution if isinstance(resolution, dict) else {}
    return {
        "url": None, "model": scenario.model, "endpoint": None, "backend": None,
        "num_requests": workload.requests, "duration": None, "concurrency": closed,
        "request_rate": None if closed else workload.rate, "burstiness": workload.burstiness,
        "warmup": 0, "max_tokens": outputs if isinstance(outputs, int) else outputs.max,
        "ignore_eos": True, "temperature": 0.0, "seed": seed, "stream": None,
        "sampling": SIMULATED, "dataset": "sim", "dataset_path": None,
        "categories": [workload.category] if workload.category else [],
        "input_tokens": _lengths(workload.input_tokens), "output_tokens": _lengths(outputs),
        "prompts_sha256": workload_sha256(scenario),
        "executor": "sim", "scenario": source, "num_spec_tokens": num_spec_tokens,
        "acceptance_source": _text(resolution.get("source")),
        "acceptance_profile": _text(resolution.get("profile")),
        "method": _method(scenario) if num_spec_tokens else None,
        **deployment(scenario, row),
        "loop": row["loop"], "fallback": row["fallback"], "shard": None,
        "settings_schema": SETTINGS_SCHEMA,
    }  # fmt: skip


#: ``settings.sampling`` of a simulated run: no request was sent, no client streamed.
SIMULATED = "simulated"
#: What a workload digest is prefixed with, so it never equals a dataset's (bench's).
_WORKLOAD_DIGEST = b"speclens.sim.workload/1\n"
#: The workload fields that are the load or the acceptance, not the requests: not digested.
_NOT_REQUESTS = frozenset({"rate", "concurrency", "burstiness", "acceptance"})


def workload_sha256(scenario: Scenario) -> str:
    """``settings.prompts_sha256`` of a simulated run: the scenario's workload section (its
    requests: category, thinking, lengths, count) canonicalised, without the load (rate,
    concurrency, burstiness: compare matches those point by point) or the acceptance (checked
    on its own). The deployment and hardware never enter it: one workload on two chips has one
    digest."""
    import hashlib

    import orjson

    fields = scenario.workload.model_dump(mode="json")
    kept = {k: v for k, v in fields.items() if k not in _NOT_REQUESTS}
    return hashlib.sha256(
        _WORKLOAD_DIGEST + orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


def deployment(scenario: Scenario, row: dict[str, Any] | None = None) -> dict[str, Any]:
    """The deployment a simulated run records in its settings, under the names an
    aggregate-only run states (``compare``'s deployment check reads them): the chip (the
    scenario's ``hardware``, else the chip its roofline priced), the precision, the tensor
    parallelism, expert parallelism and DP attention (each pool's; null when pools differ),
    prefill and decode pools as disaggregated, and the GPUs summed. ``engine`` is null: the
    simulator is no serving engine."""
    pools = scenario.deployment.pools
    parallel = {pool.parallel for pool in pools}
    ep = {pool.expert_parallel for pool in pools}
    dpa = {pool.dp_attention for pool in pools}
    chip = scenario.hardware
    if chip is None and row is not None:
        priced = [p.get("chip") for p in (row.get("pricing") or {}).values()
                  if isinstance(p, dict)]  # fmt: skip
        chip = next((c for c in priced if isinstance(c, str)), None)
    return {
        "hardware": chip, "engine": None, "precision": scenario.precision,
        "tensor_parallel": parallel.pop() if len(parallel) == 1 else None,
        "expert_parallel": ep.pop() if len(ep) == 1 else None,
        "dp_attention": dpa.pop() if len(dpa) == 1 else None,
        "disaggregated": any(pool.role != "mixed" for pool in pools),
        "gpus": scenario_gpus(scenario),
    }  # fmt: skip


def _method(scenario: Scenario) -> str | None:
    pools = scenario.speculating
    spec = pools[0].engine.speculative if pools else None
    return spec.method if spec is not None else None


def scenario_gpus(scenario: Scenario) -> int:
    """The GPUs the scenario's deployment runs on: every pool's parallel x replicas."""
    return sum(pool.parallel * pool.replicas for pool in scenario.deployment.pools)


def _text(value: object) -> str | None:
    return value[:256] if isinstance(value, str) and value else None


def _lengths(spec: int | Lengths) -> int | dict[str, int]:
    return spec if isinstance(spec, int) else {"min": spec.min, "max": spec.max}


def server_info(
    scenario: Scenario, k: int | None, resolution: dict[str, Any] | None
) -> dict[str, Any]:
    """summary.json's ``server``: what ``speclens serve`` answers on /version, for the engine
    the scenario simulates (``executor`` "sim"; the acceptance as resolved)."""
    from speclens import __version__

    pools = scenario.speculating
    spec = pools[0].engine.speculative if pools else None
    acceptance = None
    if spec is not None and resolution is not None:
        acceptance = {
            "method": spec.method, "num_speculative_tokens": k, "forced": True,
            "acceptance_length": resolution.get("acceptance_length"),
            "per_position_rates": resolution.get("per_position_rates"),
        }  # fmt: skip
    return {
        "version": __version__, "engine": "speclens", "model": scenario.model,
        "executor": "sim", "hardware": scenario.hardware, "acceptance": acceptance,
    }  # fmt: skip


# --------------------------------------------------------------------- a sweep over the simulator
#: ``speclens sim --sweep`` axis -> the sweep format's kind and axis (``speclens.runs.sweep``):
#: concurrency is a load axis, K a server axis (each K is another engine configuration).
SWEEP_AXES = {
    "concurrency": ("load", "concurrency"),
    "num_spec_tokens": ("server", "num_speculative_tokens"),
}


def sweep_state(out_dir: Path, axis: str, values: Sequence[int], seed: int) -> Sweep:
    """The sweep directory's state, one point per value and one round (a simulation is a pure
    function of its seed), named and laid out as ``speclens sweep`` does (points/<id>/)."""
    from speclens.runs.sweep import Sweep
    from speclens.runs.sweep_points import ServerSetting, points_for

    kind, name = SWEEP_AXES[axis]
    points = [
        point
        for value in values
        for point in (
            points_for(ServerSetting(None, k=value), [("concurrency", None)], 1)
            if axis == "num_spec_tokens"
            else points_for(ServerSetting(None), [("concurrency", value)], 1)
        )
    ]
    return Sweep(
        out_dir, "load" if kind == "load" else "server", 1, {name: list(values)}, points, seed
    )


def grid_state(
    out_dir: Path, axes: Sequence[str], grid: Sequence[dict[str, int]], seed: int
) -> Sweep:
    """``sweep_state`` for one axis, or for the K x concurrency grid (K outer, concurrency
    inner, in ``grid``'s order): a server sweep whose every K runs every concurrency."""
    if len(axes) == 1:
        return sweep_state(out_dir, axes[0], [g[axes[0]] for g in grid], seed)
    from speclens.runs.sweep import Sweep
    from speclens.runs.sweep_points import ServerSetting, points_for

    ks = list(dict.fromkeys(g["num_spec_tokens"] for g in grid))
    cs = list(dict.fromkeys(g["concurrency"] for g in grid))
    loads: list[tuple[str, float | None]] = [("concurrency", c) for c in cs]
    points = [p for k in ks for p in points_for(ServerSetting(None, k=k), loads, 1)]
    return Sweep(
        out_dir, "server", 1, {"num_speculative_tokens": ks, "concurrency": cs}, points, seed
    )


def sweep_problem(state: Sweep) -> str | None:
    """``output_problem`` for the sweep directory and each point's run directory."""
    root = state.root
    if root.exists() and not root.is_dir():
        return (
            f"command line: --output-dir: {str(root)!r}: is not a directory, expected a "
            "directory to write the sweep into"
        )
    for name in ("sweep.json", "sweep.csv"):
        if (root / name).exists() and not (root / name).is_file():
            return f"command line: --output-dir: {str(root)!r}: {name} is not a regular file"
    for point in state.points:
        problem = output_problem(root / point.dir)
        if problem:
            return problem
    return None
