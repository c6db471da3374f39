"""``speclens sim --trace RUN_DIR --step-cost COST.yaml [--output-dir OUT]``: replay observed
requests in the simulator (``speclens.sim.replay``), written in bench's run format with the same
``index`` for the same request, so ``compare`` puts the prediction beside the observation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from speclens.cli._common import err_console, fail, out_console, reported


def _engine_limits(scenario: Any, trace: Any) -> tuple[int, int]:
    """(max_num_seqs, the step's token budget): the scenario's first pool; else the defaults,
    with the sequences the traced server decoded at once where it said (llama.cpp's slots)."""
    from speclens.sim import limits
    from speclens.sim.scenario import Pool

    pool = scenario.deployment.pools[0] if scenario is not None else Pool()
    seqs = pool.engine.max_num_seqs
    if scenario is None and trace.max_num_seqs is not None:
        seqs = trace.max_num_seqs
    return seqs, limits.batched_tokens(pool)


def _cost(
    step_cost: Path | None, scenario: Any, scenario_path: Path | None
) -> tuple[Any, dict[str, Any], str]:
    from speclens.sim.calibrate import read_cost_file
    from speclens.sim.scenario import pool_cost

    if step_cost is not None:
        with reported():
            cost, meta = read_cost_file(step_cost)
        return cost, meta, str(step_cost)
    if (
        scenario is None
        or scenario_path is None
        or not (
            scenario.deployment.pools[0].step_cost
            or scenario.deployment.pools[0].step_cost_file
            or scenario.hardware
            or scenario.hardware_file
        )
    ):
        fail("--trace needs --step-cost COST.yaml (speclens calibrate writes one), or a "
             "scenario whose first pool prices its steps (a step cost, or hardware for a "
             "roofline)", code=2)  # fmt: skip
    pool = scenario.deployment.pools[0]
    with reported():
        return pool_cost(pool, scenario_path.parent, scenario), {}, str(scenario_path)


def _k(trace: Any, scenario: Any, scenario_path: Path | None) -> int:
    """The K the replay verifies at: the trace's; a speculating pool must name the same."""
    pools = scenario.speculating if scenario is not None else []
    spec = pools[0].engine.speculative if pools else None
    if trace.states_acceptance and trace.k is None:
        fail(f"{trace.source}: its requests state acceptance but not K (num_spec_tokens): a "
             "replay verifies K + 1 positions, so it needs K; for a server that reports none "
             "(llama.cpp), state it when benching (bench --num-spec-tokens K) or as "
             "settings.num_speculative_tokens in its summary.json", code=1)  # fmt: skip
    if spec is not None and trace.states_acceptance and spec.num_spec_tokens != trace.k:
        fail(f"{scenario_path}: deployment.pools[0].engine.speculative.num_spec_tokens: is "
             f"{spec.num_spec_tokens}, but the trace {trace.source} realized its acceptance at "
             f"K = {trace.k}: a value is refused at another K, never rescaled", code=1)  # fmt: skip
    if trace.states_acceptance:
        return int(trace.k)
    return spec.num_spec_tokens if spec is not None else 0


def _priced_by(
    cost: Any, meta: dict[str, Any], cost_source: str, step_cost: Path | None, scenario: Any
) -> str:
    """``<file>: <field>`` of what prices the replay's steps: the cost file's step cost (its
    dearest term) or roofline, or the scenario's first pool's."""
    from dataclasses import asdict

    from speclens.cost import StepCost

    if step_cost is None:
        pool = scenario.deployment.pools[0]
        for name in ("step_cost", "step_cost_file"):
            if getattr(pool, name):
                return f"{cost_source}: deployment.pools[0].{name}"
        return f"{cost_source}: {'hardware' if scenario.hardware else 'hardware_file'}"
    if not isinstance(cost, StepCost):
        return f"{cost_source}: roofline"
    terms = {name: value for name, value in asdict(cost).items() if value is not None}
    dearest = max(terms, key=lambda name: terms[name])
    return f"{cost_source}: {'step_cost.' if meta else ''}{dearest}"


def _model_problem(trace: Any, meta: dict[str, Any], step_cost: Path | None) -> str | None:
    fitted = (meta.get("provenance") or {}).get("model")
    if fitted and trace.model and fitted != trace.model:
        return (f"{step_cost}: provenance.model: fitted on {fitted!r}, but the trace "
                f"{trace.source} ran {trace.model!r}: a cost file prices one model")  # fmt: skip
    return None


def _widths(records: list[Any]) -> tuple[int, int]:
    """The fewest and most requests decoding at once in the replay (its batch widths)."""
    events = sorted([(r.start + r.ttft, 1) for r in records] + [(r.end, -1) for r in records],
                    key=lambda e: (e[0], e[1]))  # fmt: skip
    live, most = 0, 0
    for _, step in events:
        live += step
        most = max(most, live)
    return 1, max(1, most)


def replay_command(
    trace_path: Path,
    step_cost: Path | None,
    scenario_path: Path | None,
    seed: int,
    as_json: bool,
    output_dir: Path | None,
) -> None:
    from speclens.runs.record import MAX_SECONDS
    from speclens.runs.trace import TraceError, read_trace
    from speclens.sim import limits, run_output
    from speclens.sim.calibrate import extrapolation, fit_warnings
    from speclens.sim.replay import replay, settings
    from speclens.sim.scenario import load_scenario

    scenario = None
    if scenario_path is not None:
        with reported():
            scenario = load_scenario(scenario_path)
    try:
        trace = read_trace(trace_path)
    except TraceError as exc:
        fail(exc.lines)
    cost, meta, cost_source = _cost(step_cost, scenario, scenario_path)
    problem = _model_problem(trace, meta, step_cost)
    if problem:
        fail(problem)
    k = _k(trace, scenario, scenario_path)
    max_num_seqs, budget = _engine_limits(scenario, trace)
    where = _priced_by(cost, meta, cost_source, step_cost, scenario)
    problems = limits.trace_problems(trace, cost, k, where)
    if problems:
        fail(problems)
    with reported():  # the fit's own errors, read before any replay
        said = _trust(cost, meta, step_cost, scenario, scenario_path, k)
    stream = None
    if output_dir is not None:
        problem = run_output.output_problem(output_dir)
        if problem:
            fail(problem, code=2)
        from speclens.runs.report import RecordStream

        try:
            stream = RecordStream(output_dir)
        except OSError as exc:
            fail(f"command line: --output-dir: cannot write to {str(exc.filename or output_dir)!r}: "
                 f"{exc.strerror or exc}", 2)  # fmt: skip
    result = replay(trace, cost, k, max_num_seqs, budget, seed, meta.get("front_latency_s", 0.0))
    if not result.makespan > 0:
        fail(
            f"{cost_source}: the replay took {result.makespan!r} s of virtual time: price the steps"
        )
    if not result.makespan <= MAX_SECONDS:
        fail(f"{where}: the replay ran {result.makespan:.3g} s of virtual time, past a year "
             f"({MAX_SECONDS:g} s, the longest a run's records hold): expected prices in "
             "seconds")  # fmt: skip
    note = extrapolation(meta, _widths(result.records))
    figures = {**_figures(result, trace, k, note), "trust": said}
    if as_json:
        typer.echo(json.dumps(figures, indent=2))
    else:
        _print(figures)
    if note:
        err_console.print(f"note: {note}", markup=False)
    for warning in fit_warnings(meta, cost_source):
        err_console.print(f"note: {warning}", markup=False)
    if stream is not None:
        from speclens import __version__

        acceptance = {"method": None, "num_speculative_tokens": k or None, "forced": False}
        server = {"version": __version__, "engine": "speclens", "model": trace.model,
                  "executor": "sim", "hardware": None, "acceptance": acceptance}  # fmt: skip
        simulation = {"trace": str(trace.source), "trace_kind": trace.kind, "step_cost": cost_source,
                      "seed": seed, "fit": meta.get("fit"), "extrapolation": note}  # fmt: skip
        summary = run_output.summary(result.records, result.makespan,
                                     settings(trace, cost_source, seed, k), server, simulation,
                                     said)  # fmt: skip
        try:
            paths = run_output.write_run(stream, summary, result.records)
        except OSError as exc:
            fail(f"{exc.filename or output_dir}: cannot write: {exc.strerror or exc}")
        console = err_console if as_json else out_console
        for path in paths:
            console.print(f"wrote {path}", markup=False)


def _trust(cost: Any, meta: dict[str, Any], step_cost: Path | None, scenario: Any,
           scenario_path: Path | None, k: int) -> dict[str, Any]:  # fmt: skip
    """How far to trust the replay (``speclens.sim.trust``): the cost file's fit (a fit on bench
    runs: its own error on them, none held out), else the scenario's first pool's prices. The
    replay adds the cost file's front latency; a scenario's pool adds none."""
    from speclens.sim import run_output

    if step_cost is None:
        assert scenario is not None and scenario_path is not None  # as _cost found them
        return run_output.pool_trust(scenario, scenario_path.parent, 0, k > 0)
    pricing = {**cost.describe(), "source": f"from {step_cost}"}
    return run_output.priced_trust(pricing, meta, k > 0, bool(meta.get("front_latency_s")))


def _figures(result: Any, trace: Any, k: int, note: str | None) -> dict[str, Any]:
    tally = result.tally
    return {
        "trace": str(trace.source), "requests": len(result.records),
        "loop": f"closed at concurrency {trace.concurrency}" if trace.concurrency else "open",
        "num_spec_tokens": k or None, "makespan_s": result.makespan,
        "throughput": {"requests_per_s": len(result.records) / result.makespan,
                       "output_tokens_per_s": tally.output_tokens / result.makespan},
        "latency_ms": tally.latency_ms(), "extrapolation": note,
    }  # fmt: skip


def _print(figures: dict[str, Any]) -> None:
    t = figures["throughput"]
    out_console.print(
        f"replayed {figures['requests']} requests from {figures['trace']} ({figures['loop']}, "
        f"K {figures['num_spec_tokens'] or 'none'}): makespan {figures['makespan_s']:.3f} s, "
        f"{t['output_tokens_per_s']:.1f} output tok/s, {t['requests_per_s']:.3f} req/s",
        markup=False,
    )  # fmt: skip
    for name, row in figures["latency_ms"].items():
        if isinstance(row, dict) and "mean" in row:
            out_console.print(f"  {name}: mean {row['mean']:.1f} ms", markup=False)
    out_console.print(figures["trust"]["line"], markup=False, soft_wrap=True)
