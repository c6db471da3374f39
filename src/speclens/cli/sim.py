"""``speclens sim SCENARIO.yaml``: predict a deployment's throughput and latency from the
resolved acceptance, with the engine's scheduler running in virtual time."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from speclens.cli._common import (
    ACCEPTANCE_LENGTH_OPTION,
    ACCEPTANCE_RATE_OPTION,
    PER_POSITION_RATES_OPTION,
    REGISTRY_OPTION,
    cli_value,
    err_console,
    fail,
    interrupt_deferred,
    load_registry,
    out_console,
    reported,
)
from speclens.cli._fanout import RAY_OPTION, ray_address, ray_reported
from speclens.sim.fanout import cores, in_process, simulate_point
from speclens.sim.fanout import run as fanout_run
from speclens.sim.limits import (
    MAX_FAST_REQUEST_STEPS,
    MAX_NUM_SPEC_TOKENS,
    MAX_REQUEST_STEPS,
    MAX_SWEEP_POINTS,
    check,
)


def _sweep(text: str) -> tuple[str, list[int]]:
    """One ``--sweep AXIS=POINTS``: K (0, no speculation, for a disaggregated scenario only),
    concurrency, or a pool's workers or width (``deployment.pools[I].replicas``, also spelt
    ``.workers``, or ``.parallel``: a disaggregated scenario's)."""
    from speclens.sim.disagg_run import pool_axis

    name, sep, values = text.partition("=")
    axis = pool_axis(name)
    if axis is not None:
        name = f"deployment.pools[{axis[0]}].{axis[1]}"
    elif not sep or name not in ("num_spec_tokens", "concurrency"):
        fail(f"--sweep: expected num_spec_tokens=..., concurrency=... or "
             f"deployment.pools[I].workers=... (or .parallel), got {text!r}", code=2)  # fmt: skip
    try:
        if ".." in values:
            lo, hi = (int(v) for v in values.split(".."))
            if hi - lo >= MAX_SWEEP_POINTS:
                fail(f"--sweep: {values} is over the limit of {MAX_SWEEP_POINTS} points", code=2)
            points = list(range(lo, hi + 1))
        else:
            points = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        fail(f"--sweep: expected A..B or A,B,C integers, got {values!r}", code=2)
    if not points or min(points) < (0 if name == "num_spec_tokens" else 1):
        fail("--sweep: points must be integers >= 1", code=2)
    if len(points) > MAX_SWEEP_POINTS:
        fail(f"--sweep: {len(points)} points, over the limit of {MAX_SWEEP_POINTS}", code=2)
    if name == "num_spec_tokens" and max(points) > MAX_NUM_SPEC_TOKENS:
        fail(f"--sweep: num_spec_tokens up to {MAX_NUM_SPEC_TOKENS}, got {max(points)}", code=2)
    return name, points


def _grid(texts: list[str]) -> tuple[list[str], list[dict[str, int]]]:
    """The sweep's axes and its points, each a {axis: value} (K outer, concurrency inner): one
    axis, or both as a grid. An axis given twice is refused (exit 2), never ignored."""
    axes: dict[str, list[int]] = {}
    for text in texts:
        name, points = _sweep(text)
        if name in axes:
            fail(f"--sweep: {name} is given twice; give each axis once (a grid: --sweep "
                 "num_spec_tokens=... --sweep concurrency=...)", code=2)  # fmt: skip
        axes[name] = points
    pooled = sorted((n for n in axes if n.startswith("deployment.")),
                    key=lambda n: (int(n.split("[")[1].split("]")[0]), n))  # fmt: skip
    names: list[str] = [*pooled, *(n for n in ("num_spec_tokens", "concurrency") if n in axes)]
    size = 1
    for n in names:
        size *= len(axes[n])
    if size > MAX_SWEEP_POINTS:
        shape = " x ".join(str(len(axes[n])) for n in names)
        fail(f"--sweep: {shape} = {size} points, over the limit of {MAX_SWEEP_POINTS}", code=2)
    grid: list[dict[str, int]] = [{}]
    for n in names:
        grid = [{**g, n: v} for g in grid for v in axes[n]]
    return names, grid


#: Largest --seed: 32 bits, all that the forced-acceptance stream keeps.
MAX_SEED = 2**32 - 1


def _slo(text: str | None) -> dict[str, float]:
    """``--slo`` as ``runs.figures.parse_slo`` reads it (seconds by metric), each limit a
    positive number given once, and only what a simulated request keeps (TTFT, TPOT, E2E);
    anything else is one line, exit 2."""
    if text is None:
        return {}
    from speclens.runs.figures import parse_slo
    from speclens.sim.simulate import SLO_METRICS

    try:
        slos = parse_slo(text)
    except ValueError as exc:
        fail(f"command line: {exc}", code=2)
    names = [part.partition(":")[0].strip().lower() for part in text.split(",")]
    if not slos:
        fail(f"command line: --slo: expected NAME:MS,... with NAME in {', '.join(SLO_METRICS)}, "
             f"got {text!r}", code=2)  # fmt: skip
    if len(names) != len(slos):
        twice = next(n for n in names if names.count(n) > 1)
        fail(f"command line: --slo: {twice} is given twice; give each limit once", code=2)
    for name, limit in slos.items():
        if name not in SLO_METRICS:
            fail(f"command line: --slo: {name} is not simulated per request (the simulator "
                 f"keeps each request's {', '.join(SLO_METRICS)}, not its worst gap)", code=2)  # fmt: skip
        if not 0 < limit < float("inf"):
            fail(f"command line: --slo: {name}: expected milliseconds > 0, got "
                 f"{limit * 1000:g}", code=2)  # fmt: skip
    return slos


def _spread_or_slo(spread: Path | None, slos: dict[str, float]) -> str:
    """The option a refusal names: ``--acceptance-spread``, else ``--slo``."""
    return "--acceptance-spread" if spread is not None else "--slo"


def _spread_file(path: Path | None, stated: tuple[Any, Any, Any]) -> tuple[Path, Any] | None:
    """``--acceptance-spread FILE`` read (``AcceptanceSpread``; its problems one line each,
    exit 1), with the file's name. A spread is stated with its value: without an AL on the
    command line it is refused (exit 2), never laid over another layer's value."""
    if path is None:
        return None
    if all(v is None for v in stated):
        fail("command line: --acceptance-spread: goes with --acceptance-length (or "
             "--acceptance-rate, --per-position-rates): a spread is stated with the value it "
             "spreads, never laid over another layer's", code=2)  # fmt: skip
    from speclens.acceptance import AcceptanceSpread, load

    with reported():
        return path, load(AcceptanceSpread, path)


def _cli_value(k: int, stated: tuple[Any, Any, Any], spread: tuple[Path, Any] | None) -> Any:
    """The command line's value at K (``cli_value``) with its spread: a spread at another K, or
    whose quantiles' mean is beyond its tolerance of the value's AL, is refused naming the
    file and field."""
    value = cli_value(k, *stated)
    if value is None or spread is None:
        return value
    from speclens.acceptance import Problem, ValidationError
    from speclens.acceptance.spread import quantile_problems

    path, given = spread
    if given.num_spec_tokens != k:
        raise ValidationError([Problem(str(path), "num_spec_tokens", (
            f"is {given.num_spec_tokens}, but the run speculates K {k}: a spread is refused at "
            "another K, never rescaled"
        ))])  # fmt: skip
    found = quantile_problems(given.values, k, value.length, given.tolerance)
    if found:
        raise ValidationError([Problem(str(path), "quantiles", m)
                               for m in found])  # fmt: skip
    return value.model_copy(update={"spread": given})


def _spread_note(resolution: Any, spread: tuple[Path, Any] | None) -> dict[str, Any]:
    """What a run's tails rest on: each request's own AL from the resolution's spread (the
    line names its quantiles and where it came from), or ``SPREAD_UNKNOWN``."""
    from speclens.acceptance.spread import SPREAD_UNKNOWN

    given = resolution.spread
    if given is None:
        return {"simulated": False, "line": SPREAD_UNKNOWN, "source": None}
    if resolution.layer == "cli" and spread is not None:
        origin = f"--acceptance-spread {spread[0]}"
    elif resolution.profile:
        origin = f"the {resolution.layer} layer ({resolution.profile_set}: {resolution.profile})"
    else:
        origin = f"the {resolution.layer} layer's value"
    q = given.quantiles
    line = (f"spread: each request draws its own AL (p10 {q['p10']:.2f}, p50 {q['p50']:.2f}, "
            f"p90 {q['p90']:.2f} over {given.requests:,} requests"
            + (f", measured on {given.source}" if given.source else "") + f") from {origin}")  # fmt: skip
    return {"simulated": True, "line": line, "source": given.source or origin}


def _check_plot(plot: Path, sweep: str | None) -> None:
    """Refuse a --plot that cannot be written, before any simulation (exit 2)."""
    if sweep is None:
        fail("--plot needs --sweep: it draws throughput against latency across the points", 2)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    suffix = plot.suffix.lower().lstrip(".")
    parent = plot.parent
    if plot.is_dir():
        fail(f"--plot: {plot}: is a directory, expected a file to write", 2)
    if suffix not in formats:
        known = ", ".join(f".{f}" for f in sorted(formats))
        fail(f"--plot: {plot}: expected an image file name ending in one of {known}", 2)
    if not parent.is_dir():
        fail(f"--plot: {plot}: directory {parent} does not exist", 2)
    if not os.access(parent, os.W_OK) or (plot.exists() and not os.access(plot, os.W_OK)):
        fail(f"--plot: {plot}: not writable", 2)


def sim(
    scenario_path: Path | None = typer.Argument(
        None, exists=True, dir_okay=False, help="The scenario YAML (optional with --trace)."
    ),
    acceptance_length: float | None = ACCEPTANCE_LENGTH_OPTION,
    acceptance_rate: float | None = ACCEPTANCE_RATE_OPTION,
    per_position_rates: str | None = PER_POSITION_RATES_OPTION,
    acceptance_spread: Path | None = typer.Option(
        None,
        "--acceptance-spread",
        metavar="FILE",
        help="With --acceptance-length (or --acceptance-rate, --per-position-rates): the "
        "per-request AL's spread around it (num_spec_tokens, quantiles p0..p100, requests): "
        "each request draws its own AL.",
    ),
    slo: str | None = typer.Option(
        None,
        "--slo",
        metavar="NAME:MS,...",
        help="ttft:200,tpot:20,e2e:9000 (ms): goodput, the requests meeting every limit; "
        "--at-interactivity leaves out points whose per-request p90 misses one.",
    ),
    registry: list[Path] = REGISTRY_OPTION,
    sweep: list[str] = typer.Option(
        [],
        "--sweep",
        metavar="AXIS=POINTS",
        help="num_spec_tokens=1..8 or concurrency=1,8,32: one row per point; give both for "
        "the grid. A disaggregated scenario adds deployment.pools[I].workers=1..4 and "
        "deployment.pools[I].parallel=4,8, and K 0.",
    ),
    at_interactivity: float | None = typer.Option(
        None,
        "--at-interactivity",
        help="With --sweep concurrency=...: each K's output tok/s/GPU at this many tok/s/user, "
        "and which K wins (a disaggregated scenario: which prefill:decode split and K, with "
        "its serving flags).",
    ),
    context: str | None = typer.Option(
        None,
        "--context",
        help="1k,8k,32k (k = 1024 tokens): the K schedule, best K by concurrency (or at "
        "--at-interactivity) x context length, against no speculation.",
    ),
    emit: str | None = typer.Option(
        None,
        "--emit",
        help="With --context: the engine flags for the schedule's Ks: vllm, "
        "atom, sglang or trtllm.",
    ),
    seed: int = typer.Option(0, "--seed", help=f"Seed of every draw, 0..{MAX_SEED}."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    plot: Path | None = typer.Option(
        None, "--plot", help="With --sweep: write a PNG of throughput against latency."
    ),
    max_request_steps: int | None = typer.Option(
        None,
        "--max-request-steps",
        help=f"Refuse a run whose requests x longest output exceeds this (bounds time, memory); "
        f"default {MAX_FAST_REQUEST_STEPS:,} on the fast path, {MAX_REQUEST_STEPS:,} on the "
        "step-exact loop.",
    ),
    exact: bool = typer.Option(
        False,
        "--exact",
        help="Run the step-exact loop (the engine's own scheduler, step by step) instead of "
        "the event-level fast path.",
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", help="Sweep points run in this many processes (default: the cores)."
    ),
    ray: str | None = RAY_OPTION,
    output_dir: Path | None = typer.Option(
        None,
        "--output-dir",
        help="Write the run as bench does (records.jsonl, summary.json, summary.csv, plots).",
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="Replay these requests: a run directory (bench or sim) or a Mooncake-style JSONL "
        "trace (timestamp ms, input_length, output_length).",
    ),
    step_cost: Path | None = typer.Option(
        None,
        "--step-cost",
        help="With --trace: the step cost YAML (speclens calibrate's output); "
        "on published points it may be left out: the catalog's defaults for their chip.",
    ),
    precision: str | None = typer.Option(
        None,
        "--precision",
        help="The weights' precision on the scenario's hardware, over the scenario's own: fp8, "
        "or fp4 (FP4 routed experts, as InferenceX runs them).",
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="With --trace on published points: the speculative method to predict (mtp), with "
        "--num-speculative-tokens and --acceptance-length.",
    ),
    num_speculative_tokens: int | None = typer.Option(
        None,
        "--num-speculative-tokens",
        help="With --trace on published points and --method: K.",
    ),
) -> None:
    """Simulate a scenario with the resolved acceptance, or replay a trace (--trace)."""
    from speclens.acceptance import WorkloadAcceptance, resolve
    from speclens.sim.catalog import PRECISIONS
    from speclens.sim.scenario import load_scenario
    from speclens.sim.simulate import fast_fallback

    if not 0 <= seed <= MAX_SEED:
        fail(f"--seed: expected an integer in 0..{MAX_SEED}, got {seed}", code=2)
    if precision is not None and precision not in PRECISIONS:
        fail(f"--precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}", code=2)
    if (
        num_speculative_tokens is not None
        and not 1 <= num_speculative_tokens <= MAX_NUM_SPEC_TOKENS
    ):
        fail(f"--num-speculative-tokens: expected an integer in 1..{MAX_NUM_SPEC_TOKENS}, got "
             f"{num_speculative_tokens}", code=2)  # fmt: skip
    if trace is not None and ray is not None:
        fail("command line: --ray: goes with a scenario; a replay (--trace) is one run", code=2)
    slos = _slo(slo)
    if trace is not None and (acceptance_spread is not None or slos):
        fail(f"command line: {_spread_or_slo(acceptance_spread, slos)}: goes with a scenario; "
             "a replay (--trace) keeps each recorded request's own acceptance, and a published "
             "point is predicted from its mean AL only", code=2)  # fmt: skip
    address = ray_address(ray)
    if trace is not None:
        from speclens.cli.calibrate_points import is_published

        if trace.is_dir() and is_published([trace]):
            from speclens.cli.sim_published import predict_command

            predict_command(trace, step_cost, method, num_speculative_tokens, acceptance_length,
                            precision, output_dir, as_json)  # fmt: skip
            return
        if method is not None or num_speculative_tokens is not None:
            fail("--method and --num-speculative-tokens go with --trace on published points "
                 "(speclens import writes them); a replayed run keeps its own K", 2)  # fmt: skip
        if precision is not None:
            fail("--precision goes with a scenario: a replay takes its cost from --step-cost", 2)
        from speclens.cli.sim_trace import replay_command

        replay_command(trace, step_cost, scenario_path, seed, as_json, output_dir)
        return
    if step_cost is not None:
        fail("--step-cost goes with --trace (a scenario prices its pools itself)", code=2)
    if method is not None or num_speculative_tokens is not None:
        fail("--method and --num-speculative-tokens go with --trace on published points (a "
             "scenario states its speculation)", code=2)  # fmt: skip
    if scenario_path is None:
        fail("missing SCENARIO: give a scenario file, or --trace to replay a run", code=2)
    if max_request_steps is not None and max_request_steps < 1:
        fail(f"--max-request-steps: expected an integer >= 1, got {max_request_steps}", code=2)
    if jobs is not None and jobs < 1:
        fail(f"--jobs: expected an integer >= 1, got {jobs}", code=2)
    axes, grid = _grid(sweep)
    name = " x ".join(axes)
    from speclens.sim.disagg_run import states_disaggregated

    if states_disaggregated(scenario_path):  # one prefill pool and one decode pool
        from speclens.cli.sim_disagg import Flags, disagg_command

        if acceptance_spread is not None or slos:
            fail(f"command line: {_spread_or_slo(acceptance_spread, slos)}: a disaggregated "
                 "deployment is simulated in its steady state from the mean AL, with no "
                 "per-request tails to spread or hold to an SLO", code=2)  # fmt: skip
        disagg_command(scenario_path, axes, grid, Flags(
            at_interactivity, context, emit, plot, exact, address, seed, as_json, output_dir,
            precision, registry, (acceptance_length, acceptance_rate, per_position_rates),
        ))  # fmt: skip
        return
    for axis in axes:
        if axis.startswith("deployment."):
            fail(f"--sweep: {axis} goes with a disaggregated scenario (a prefill pool and a "
                 "decode pool)", code=2)  # fmt: skip
    if any(g.get("num_spec_tokens") == 0 for g in grid):
        fail("--sweep: points must be integers >= 1", code=2)
    if at_interactivity is not None and "concurrency" not in axes:
        fail("--at-interactivity needs --sweep concurrency=...: each K's curve runs over "
             "concurrency", code=2)  # fmt: skip
    if at_interactivity is not None and not 0 < at_interactivity < float("inf"):
        fail(f"--at-interactivity: expected tok/s/user > 0, got {at_interactivity:g}", code=2)
    if emit is not None and context is None:
        fail("--emit needs --context: it writes the flags of the K schedule", code=2)
    if slos and context is not None:
        fail(
            "command line: --slo: does not go with --context (the schedule reads TPOT p50 at "
            "each point; run --sweep with --at-interactivity to hold points to an SLO)",
            2,
        )
    stated = (acceptance_length, acceptance_rate, per_position_rates)
    spread = _spread_file(acceptance_spread, stated)
    if context is not None:
        _schedule_command(scenario_path, context, emit, grid, axes, at_interactivity, seed,
                          precision, registry, plot, output_dir, as_json, jobs, address,
                          stated, spread)  # fmt: skip
        return
    if plot is not None:
        _check_plot(plot, name or None)
    ks: list[int | None] = (
        [*sorted({g["num_spec_tokens"] for g in grid})] if "num_spec_tokens" in axes else [None]
    )
    with reported():
        scenario = load_scenario(scenario_path, precision)
        # The fast path runs where it can represent every point (a speculating pool always
        # runs a resolved, forced schedule here); the budget follows the path. It models a KV
        # cache that fills, but a run that writes records steps exactly where its draws fill it.
        records = output_dir is not None
        fallbacks = [] if exact else [fast_fallback(scenario, [], k, kv=records) for k in ks]
        fast = not exact and not any(fallbacks)
        budget = max_request_steps or (MAX_FAST_REQUEST_STEPS if fast else MAX_REQUEST_STEPS)
        check(scenario, str(scenario_path), ks, budget, runs=len(grid), base=scenario_path.parent,
              keeps_requests=not fast or records)  # fmt: skip
        _check_closed_loop(scenario_path, scenario, grid)
        speculative = [p.engine.speculative for p in scenario.speculating]
        if spread is not None and speculative and speculative[0] is not None:
            for k in ks:  # refused before any file is opened
                _cli_value(speculative[0].num_spec_tokens if k is None else k, stated, spread)
        reg = load_registry(registry)
        trusts = _trusts(scenario, scenario_path.parent, ks, grid)
    out = _open_output(output_dir, scenario, axes, grid, seed) if output_dir else None

    pools = scenario.speculating
    spec = pools[0].engine.speculative if pools else None
    calls: list[dict[str, Any]] = []
    resolutions: list[Any] = []
    resolved: dict[int, Any] = {}
    for point in grid:
        k = point.get("num_spec_tokens", spec.num_spec_tokens if spec else None)
        resolution = resolved.get(k) if k is not None else None
        rates = resolution.per_position_rates if resolution else None
        if spec is not None and k is not None and resolution is None:
            workload = scenario.workload
            with reported():
                resolution = resolve(
                    model=scenario.model, method=spec.method, num_spec_tokens=k,
                    hardware=scenario.hardware, registry=reg,
                    workload=WorkloadAcceptance(thinking=workload.thinking, category=workload.category, acceptance=workload.acceptance),
                    scenario=scenario.acceptance, cli=_cli_value(k, stated, spread),
                )  # fmt: skip
            rates = resolution.per_position_rates
            resolved[k] = resolution
        resolutions.append(resolution)
        calls.append(dict(
            scenario=scenario, base=scenario_path.parent, rates=rates, seed=seed,
            concurrency=point.get("concurrency"),
            num_spec_tokens=point.get("num_spec_tokens"),
            max_request_steps=budget, source=str(scenario_path),
            draft_coverage=resolution.draft_coverage if resolution else 1.0, fast=not exact,
            keep_records=out is not None,
            spread=resolution.spread if resolution else None, slo=slos or None,
        ))  # fmt: skip
    workers = jobs or cores()
    written: list[Path] = []

    def finish(i: int, result: dict[str, Any]) -> dict[str, Any]:
        """A point's result as printed; with --output-dir its files are written now and its
        records dropped, so a sweep holds only the points in flight."""
        records = result.pop("records", [])
        resolution = resolutions[i]
        result["resolution"] = resolution.model_dump() if resolution else None
        result["spread"] = _spread_note(resolution, spread) if resolution else None
        result["trust"] = trusts[calls[i]["num_spec_tokens"]]
        if name:
            result["sweep"] = dict(grid[i])
        if out is not None:
            state, streams = out
            k = calls[i]["num_spec_tokens"] or (spec.num_spec_tokens if spec else None)
            written.extend(_write_run(streams[i], scenario, str(scenario_path), seed, calls[i],
                                      result, records, k, slos))  # fmt: skip
            if state is not None:
                state.record(state.points[i], 0)
        return result

    in_flight = workers
    if out is not None:
        from speclens.sim import run_output
        from speclens.sim.limits import longest

        lengths = scenario.workload
        in_flight = run_output.points_in_flight(
            lengths.requests, longest(lengths.output_tokens), workers
        )
    with reported(), ray_reported():
        rows = _run(calls, workers, torch=not fast, on_result=finish, in_flight=in_flight,
                    ray_address=address)  # fmt: skip
    decision = None
    if at_interactivity is not None:
        from speclens.sim.decide import decide

        own = spec.num_spec_tokens if spec else 0
        gpus = sum(p.parallel * p.replicas for p in scenario.deployment.pools)
        decision = decide(
            [(g.get("num_spec_tokens", own), r) for g, r in zip(grid, rows, strict=True)],
            at_interactivity, gpus, slos or None,
        )  # fmt: skip
        _decision_trust(decision, trusts)
    if as_json:
        document: Any = rows if name else rows[0]
        if decision is not None:
            document = {"decision": decision, "points": rows}
        typer.echo(json.dumps(document, indent=2))
    else:
        if decision is not None:
            _print_decision(decision)
        _print(rows, axes, trust=decision is None, slo=slos)
    if plot is not None:
        _plot(rows, axes, plot)
        (err_console if as_json else out_console).print(f"wrote {plot}")
    if out is not None:
        state, _ = out
        console = err_console if as_json else out_console
        if state is None:
            for path in written:
                console.print(f"wrote {path}", markup=False)
        else:
            _write_sweep(state, console, decision)


def _schedule_command(
    scenario_path: Path, context: str, emit: str | None, grid: list[dict[str, int]],
    axes: list[str], target: float | None, seed: int, precision: str | None,
    registry: list[Path], plot: Path | None, output_dir: Path | None, as_json: bool,
    jobs: int | None, address: str | None, values: tuple[Any, Any, Any],
    spread: tuple[Path, Any] | None = None,
) -> None:  # fmt: skip
    """``--context``: the K x concurrency grid, K 0 added, once per context length; the
    schedule table first, then each K's loss at long context named by its term, then the
    engine flags with ``--emit``."""
    from speclens.acceptance import WorkloadAcceptance, resolve
    from speclens.sim import run_output
    from speclens.sim import schedule as sc
    from speclens.sim.scenario import load_scenario, roofline
    from speclens.sim.simulate import fast_fallback

    if axes != ["num_spec_tokens", "concurrency"]:
        fail("--context needs --sweep num_spec_tokens=... and --sweep concurrency=...: the "
             "schedule picks K at each concurrency", code=2)  # fmt: skip
    try:
        contexts = sc.parse_contexts(context)
    except ValueError as exc:
        fail(f"--context: {exc}", code=2)
    if emit is not None and emit not in sc.ENGINES:
        fail(f"--emit: expected one of {', '.join(sc.ENGINES)}, got {emit!r}", code=2)
    if plot is not None:
        fail("--plot does not go with --context (the schedule is a table; --output-dir "
             "writes its page with the plot)", code=2)  # fmt: skip
    if output_dir is not None:
        from speclens.sim.run_output import SCHEDULE_FILES, output_problem

        problem = output_problem(output_dir, SCHEDULE_FILES)
        if problem:
            fail(problem, code=2)
    ks = sorted({g["num_spec_tokens"] for g in grid})
    concurrencies = sorted({g["concurrency"] for g in grid})
    size = len(contexts) * (len(ks) + 1) * len(concurrencies)
    if size > sc.MAX_SCHEDULE_POINTS:
        fail(f"--context: {len(contexts)} contexts x {len(ks) + 1} K (K 0 included) x "
             f"{len(concurrencies)} concurrencies = {size} points, over the limit of "
             f"{sc.MAX_SCHEDULE_POINTS}", code=2)  # fmt: skip
    with reported():
        base_scenario = load_scenario(scenario_path, precision)
        pools = base_scenario.speculating
        if not pools:
            fail(f"{scenario_path}: deployment.pools: --context needs a speculating pool to "
                 "schedule K for")  # fmt: skip
        spec = pools[0].engine.speculative
        assert spec is not None
        if emit is not None:  # what the engine cannot take is refused before any simulation
            _check_emit(scenario_path, base_scenario, emit, spec.method, ks)
        _check_closed_loop(scenario_path, base_scenario, grid)
        reg = load_registry(registry)
        resolved = {}
        for k in ks:
            workload = base_scenario.workload
            resolved[k] = resolve(
                model=base_scenario.model, method=spec.method, num_spec_tokens=k,
                hardware=base_scenario.hardware, registry=reg,
                workload=WorkloadAcceptance(thinking=workload.thinking, category=workload.category, acceptance=workload.acceptance),
                scenario=base_scenario.acceptance, cli=_cli_value(k, values, spread),
            )  # fmt: skip
        base = scenario_path.parent
        said = run_output.combined([
            ("K 0", run_output.run_trust(base_scenario, base, 0)),
            ("each K", run_output.run_trust(base_scenario, base, ks[0])),
        ])  # fmt: skip
    calls: list[dict[str, Any]] = []
    keys: list[tuple[int, int, int]] = []
    fast = True
    for c in contexts:
        scenario = sc.with_context(base_scenario, c)
        with reported():
            for n in concurrencies:
                own = sc.at_concurrency(scenario, n)
                fast = fast and not any(fast_fallback(own, [], k, kv=False) for k in ks)
    budget = MAX_FAST_REQUEST_STEPS if fast else MAX_REQUEST_STEPS
    for c in contexts:
        scenario = sc.with_context(base_scenario, c)
        with reported():
            check(scenario, str(scenario_path), ks, budget, runs=len(grid),
                  base=scenario_path.parent, keeps_requests=not fast)  # fmt: skip
        for k in [0, *ks]:
            for n in concurrencies:
                res = resolved.get(k)
                own = sc.at_concurrency(scenario, n)
                calls.append(dict(
                    scenario=sc.without_speculation(own) if k == 0 else own,
                    base=scenario_path.parent,
                    rates=res.per_position_rates if res else None, seed=seed, concurrency=n,
                    num_spec_tokens=None if k == 0 else k, max_request_steps=budget,
                    source=str(scenario_path),
                    draft_coverage=res.draft_coverage if res else 1.0, fast=True,
                    keep_records=False, spread=res.spread if res else None,
                ))  # fmt: skip
                keys.append((c, k, n))
    with reported(), ray_reported():
        rows = _run(calls, jobs or cores(), torch=not fast, ray_address=address)
    gpus = sum(p.parallel * p.replicas for p in base_scenario.deployment.pools)
    sched = sc.schedule([(c, k, n, r) for (c, k, n), r in zip(keys, rows, strict=True)],
                        gpus, target)  # fmt: skip
    with reported():
        roof = roofline(base_scenario, pools[0], scenario_path.parent, str(scenario_path))
    sched["losses"] = sc.attribute(sched, roof, base_scenario.workload.concurrency or
                                   concurrencies[0])  # fmt: skip
    sched["points"] = [
        {"context": c, "num_spec_tokens": k, "concurrency": n,
         "tok_s_gpu": r["throughput"]["output_tokens_per_s"] / gpus,
         "tpot_p50_ms": (r["latency_ms"].get("tpot") or {}).get("p50"), "loop": r["loop"]}
        for (c, k, n), r in zip(keys, rows, strict=True)
    ]  # fmt: skip
    sched["acceptance"] = [{**resolved[k].model_dump(), "line": _acceptance_text(
        resolved[k].model_dump(), f" at K {k}")} for k in ks]  # fmt: skip
    pricing = next((r.get("pricing") for (_, k, _), r in zip(keys, rows, strict=True) if k), None)
    sched["pricing"] = [{"pool": int(i), **p, "line": f"pool {i} steps: {_pricing(p)}"}
                        for i, p in (pricing or {}).items()]  # fmt: skip
    sched["model"], sched["method"] = base_scenario.model, spec.method
    sched["trust"] = said
    sched["deployment"] = run_output.deployment(base_scenario)
    if emit is not None:
        sched["emit"] = {"engine": emit, "lines": sc.emit_lines(sched, emit, spec.method)}
    if as_json:
        typer.echo(json.dumps({"schedule": sched}, indent=2))
    else:
        _print_schedule(sched)
    if output_dir is not None:
        from speclens.runs.html_schedule import write_schedule_report

        target_file = output_dir / "k_schedule.json"
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
            target_file.write_text(json.dumps(sched, indent=2) + "\n")
            page = write_schedule_report(output_dir)
        except OSError as exc:
            fail(f"{exc.filename or output_dir}: cannot write: {exc.strerror or exc}")
        console = err_console if as_json else out_console
        for path in (target_file, page):
            console.print(f"wrote {path}", markup=False)


def _trusts(scenario: Any, base: Path, ks: list[int | None],
            grid: list[dict[str, Any]] | None = None) -> dict[int | None, dict[str, Any]]:  # fmt: skip
    """How far to trust each K's runs (``run_output.run_trust``; None: the scenario's own K) at
    the grid's concurrencies, before any simulation: a cost file whose fit records a broken
    error is refused first."""
    from speclens.sim import run_output

    pools = scenario.speculating
    own = pools[0].engine.speculative.num_spec_tokens if pools else None
    swept = sorted(int(g["concurrency"]) for g in grid or [] if g.get("concurrency"))
    widths = (swept[0], swept[-1]) if swept else None
    return {k: run_output.run_trust(scenario, base, own if k is None else k, widths) for k in ks}


def _decision_trust(decision: dict[str, Any], trusts: dict[int | None, dict[str, Any]]) -> None:
    """The decision's expected error (``trust``: its Ks' statements as one) and each K's band
    at the target (``expected_low`` to ``expected_high``: its tok/s/GPU / and x (1 + the
    throughput error)), where the error was measured."""
    from speclens.sim import run_output, trust

    said = run_output.combined([(f"K {k}" if k is not None else "the scenario's K", t)
                                for k, t in trusts.items()])  # fmt: skip
    decision["trust"] = said
    errors = said.get("expected_error")
    for e in decision["ks"]:
        band = None
        if isinstance(errors, dict) and e["tok_s_gpu"] is not None:
            stated = trust.Trust(said["basis"], said["line"], expected=trust.Errors(**errors))
            band = stated.band("throughput", e["tok_s_gpu"])
        e["expected_low"], e["expected_high"] = band or (None, None)


def _check_closed_loop(path: Path, scenario: Any, grid: list[dict[str, int]]) -> None:
    """A closed loop at a concurrency over the requests (it would repeat the run at that many)
    is refused before any simulation: a ``--sweep`` point exit 2, the scenario's own
    concurrency exit 1."""
    from speclens.sim.simulate import closed_loop_problem

    for c in sorted({g["concurrency"] for g in grid if "concurrency" in g}, reverse=True):
        problem = closed_loop_problem(scenario, c)
        if problem:
            fail(f"command line: --sweep: concurrency={c} with {path}: {problem}", code=2)
        return
    problem = closed_loop_problem(scenario)
    if problem:
        fail(f"{path}: workload.concurrency: {problem}")


def _check_emit(path: Path, scenario: Any, engine: str, method: str, ks: list[int]) -> None:
    """``--emit ENGINE`` on a method the engine has no flag for: one line naming the
    scenario's field, exit 2 (the rules are ``profiles resolve --emit``'s)."""
    from speclens.acceptance.emit import EmitRefused
    from speclens.sim import schedule as sc

    index = next(i for i, p in enumerate(scenario.deployment.pools) if p.engine.speculative)
    try:
        for k in ks:
            sc.flags(engine, method, k)
    except EmitRefused as exc:
        fail(f"{path}: deployment.pools[{index}].engine.speculative.method: --emit {engine} "
             f"cannot serve it: {exc}", code=2)  # fmt: skip


def _print_schedule(sched: dict[str, Any]) -> None:
    """The schedule table first (best K and its gain over no speculation), then each loss at
    long context and its term, then the engine flags."""
    from speclens.sim import schedule as sc

    def say(text: str) -> None:
        out_console.print(text, markup=False, highlight=False, soft_wrap=True)

    target = sched["tok_s_user"]
    axis = f"at {target:g} tok/s/user" if target is not None else "by concurrency"
    say(f"K schedule {axis} x context "
        f"{', '.join(sc.tokens(c) for c in sched['contexts'])}: best K and its gain over no "
        f"speculation (tok/s/GPU, {sched['gpus']} GPUs)")  # fmt: skip
    table = Table()
    table.add_column("tok/s/user" if target is not None else "concurrency", justify="right")
    for c in sched["contexts"]:
        table.add_column(f"context {sc.tokens(c)}", justify="right")
    for row in sched["rows"]:
        head = f"{row['tok_s_user']:g}" if target is not None else str(row["concurrency"])
        table.add_row(head, *(sc.cell_text(cell) for cell in row["cells"]))
    out_console.print(table)
    say(f"each context fixes every request's input at that many tokens (k = "
        f"{sc.CONTEXT_UNIT}); K 0 is no speculation")  # fmt: skip
    for row in sched["rows"]:
        for cell in row["cells"]:
            if cell.get("reason"):
                say(cell["reason"])
    for loss in sched["losses"]:
        say(loss["line"])
    if not sched["losses"]:
        say("no context's best K is below the shortest context's")
    for item in (*sched.get("acceptance", []), *sched.get("pricing", [])):
        say(item["line"])
    if sched.get("trust"):
        say(sched["trust"]["line"])
    for line in sched.get("emit", {}).get("lines", []):
        say(line)


def _open_output(
    output_dir: Path, scenario: Any, axes: list[str], grid: list[dict[str, int]], seed: int
) -> tuple[Any, list[Any]]:
    """The sweep's state (None for one run) and each run's records stream, opened before any
    simulation: a directory that cannot take the files, or a run too long to keep per request,
    is one line and exit 2."""
    from speclens.runs.report import RecordStream
    from speclens.sim import run_output
    from speclens.sim.limits import longest

    workload = scenario.workload
    state = run_output.grid_state(output_dir, axes, grid, seed) if axes else None
    problem = (
        run_output.sweep_problem(state) if state else run_output.output_problem(output_dir)
    ) or run_output.recorded_steps_problem(workload.requests, longest(workload.output_tokens))
    if problem:
        fail(problem, code=2)
    dirs = [output_dir / p.dir for p in state.points] if state else [output_dir]
    try:
        return state, [RecordStream(d) for d in dirs]
    except OSError as exc:
        where = exc.filename or output_dir
        fail(
            f"command line: --output-dir: cannot write to {str(where)!r}: {exc.strerror or exc}", 2
        )


def _write_sweep(state: Any, console: Any, decision: dict[str, Any] | None = None) -> None:
    """sweep.json and sweep.csv (each point's figures from its run directory, as ``speclens
    sweep`` computes them), decision.json with --at-interactivity (a stale one goes), then the
    sweep's report.html (the decision at its top)."""
    from speclens.runs.html_sweep import write_sweep_report

    try:
        written = state.write()
        target = state.root / "decision.json"
        if decision is not None:
            target.write_text(json.dumps(decision, indent=2) + "\n")
            written = [*written, target]
        elif target.is_file():
            target.unlink()
        paths = [*written, write_sweep_report(state.root, decision)]
    except OSError as exc:
        fail(f"{exc.filename or state.root}: cannot write: {exc.strerror or exc}")
    console.print(
        f"wrote {len(state.points)} run directories under {state.root / 'points'}", markup=False
    )
    for path in paths:
        console.print(f"wrote {path}", markup=False)


def _write_run(
    stream: Any, scenario: Any, source: str, seed: int, call: dict[str, Any],
    row: dict[str, Any], records: list[Any], k: int | None, slo: dict[str, float] | None = None,
) -> list[Path]:  # fmt: skip
    """records.jsonl, summary.json (bench's shape, ``summarize`` over the records; its goodput
    under ``slo``), summary.csv and the plots; a file that cannot be written is one line and
    exit 1."""
    from speclens.sim import run_output

    settings = run_output.run_settings(scenario, source, seed, call["concurrency"], k, row)
    summary = run_output.summary(
        records, row["makespan_s"], settings,
        run_output.server_info(scenario, k, row["resolution"]), row, row.get("trust"), slo,
    )  # fmt: skip
    try:
        return run_output.write_run(stream, summary, records)
    except OSError as exc:
        fail(f"{exc.filename or stream.path.parent}: cannot write: {exc.strerror or exc}")


def _run(
    calls: list[dict[str, Any]], jobs: int, torch: bool,
    on_result: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
    in_flight: int | None = None, ray_address: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every sweep point, in order (``speclens.sim.fanout.run``): in this process, in ``jobs``
    spawned processes, or as Ray tasks with ``ray_address``. ``torch``: the step-exact loop runs,
    so where it runs in this process torch loads first (with Ctrl-C held)."""
    if torch and ray_address is None and in_process(len(calls), jobs, in_flight):
        with interrupt_deferred():
            import speclens.sim.coverage  # noqa: F401
    return fanout_run(simulate_point, calls, jobs, ray_address=ray_address,
                      on_result=on_result, in_flight=in_flight)  # fmt: skip


def _print_decision(decision: dict[str, Any]) -> None:
    """The decision's line first, then one table: each K's AL, tok/s/GPU at the target and its
    ratio to the best."""
    from speclens.runs.decision import k_name as label

    out_console.print(decision["headline"], markup=False, highlight=False, soft_wrap=True)
    target = decision["tok_s_user"]
    table = Table(title=f"at {target:g} tok/s/user, {decision['gpus']} GPUs")
    banded = any(e.get("expected_low") is not None for e in decision["ks"])
    for col in ("K", "AL", f"tok/s/GPU at {target:g}", "ratio to best",
                *(["expected range"] if banded else [])):  # fmt: skip
        table.add_column(col, justify="right")
    for e in decision["ks"]:
        al = e["acceptance_length"]
        value = e["tok_s_gpu"]
        low, high = e.get("expected_low"), e.get("expected_high")
        table.add_row(
            label(e["num_spec_tokens"]).removeprefix("K "),
            f"{al:.2f}" if al is not None else "-",
            f"{value:,.0f}" if value is not None else e.get("reason", "-"),
            f"{e['ratio_to_best']:.3f}" if e["ratio_to_best"] is not None else "-",
            *([f"{low:,.0f} to {high:,.0f}" if low is not None else "-"] if banded else []),
        )
    out_console.print(table)
    out_console.print(decision["interval"], markup=False, highlight=False)
    for e in decision["ks"]:
        for point in e.get("left_out", []):
            where = " ".join(
                f"{SHORT_AXIS.get(a, a)}={v}" for a, v in (point["sweep"] or {}).items()
            )
            out_console.print(f"left out {where}: {', '.join(point['misses'])}", markup=False,
                              highlight=False, soft_wrap=True)  # fmt: skip
    if decision.get("trust"):
        out_console.print(decision["trust"]["line"], markup=False, highlight=False,
                          soft_wrap=True)  # fmt: skip


#: The latencies sim's table prints (metric, percentile), in ms.
LATENCY_COLUMNS = (("ttft", "p50"), ("tpot", "p50"), ("tpot", "p90"), ("tpot", "p99"),
                   ("itl", "p99"), ("e2e", "p99"))  # fmt: skip


def _print(
    rows: list[dict[str, Any]], axes: list[str], trust: bool = True,
    slo: dict[str, float] | None = None,
) -> None:  # fmt: skip
    """Two tables that each fit 100 columns: throughput and acceptance (goodput under ``slo``),
    then the latencies in ms, TPOT's tails among them; then how steps were priced, what the
    tails rest on (the spread, or that it is unknown), and (``trust``: unless the decision
    above said it) how far to trust the figures."""
    table = Table(title="speclens sim")
    for col in [*axes, "AL", "coverage", "tok/step", "req/s", "out tok/s",
                *(["goodput"] if slo else [])]:  # fmt: skip
        table.add_column(col, justify="right")
    latency = Table(title="latency (ms)")
    for col in [*axes, *(f"{m.upper()} {q}" for m, q in LATENCY_COLUMNS)]:
        latency.add_column(col, justify="right")
    for r in rows:
        lat = r["latency_ms"]
        good = r.get("goodput")
        point = [str(r["sweep"][a]) for a in axes]
        table.add_row(
            *point,
            f"{r['realized_acceptance_length']:.3f}" if r["realized_acceptance_length"] else "-",
            f"{r['draft_coverage']:.3f}" if r["draft_coverage"] is not None else "-",
            f"{r['tokens_per_step']:.3f}" if r["tokens_per_step"] is not None else "-",
            f"{r['throughput']['requests_per_s']:.2f}",
            f"{r['throughput']['output_tokens_per_s']:,.0f}",
            *([f"{good['fraction']:.1%}" if good else "-"] if slo else []),
        )
        latency.add_row(*point, *(f"{lat[m][q]:,.1f}" if lat[m] else "-"
                                  for m, q in LATENCY_COLUMNS))  # fmt: skip
    out_console.print(table)
    out_console.print(latency)
    fallback = rows[0].get("fallback")
    out_console.print(
        f"step-exact loop: the fast path cannot represent {fallback}"
        if fallback
        else f"{rows[0]['loop']} path"
        + (" (--exact for the step-exact loop)" if rows[0]["loop"] == "fast" else "")
    )
    preempted = [r.get("preemptions") or 0 for r in rows]
    if any(preempted):
        out_console.print(f"the KV cache filled: {', '.join(f'{n:,}' for n in preempted)} "
                          "preemptions (requests recomputed from their prompt and output)")  # fmt: skip
    for index, pricing in rows[0].get("pricing", {}).items():
        out_console.print(f"pool {index} steps: {_pricing(pricing)}")
    for line in dict.fromkeys(r["trust"]["line"] for r in rows if trust and r.get("trust")):
        out_console.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in _warmup_lines(rows, axes):
        out_console.print(line, markup=False, highlight=False, soft_wrap=True)
    res = rows[0]["resolution"]
    if res:
        out_console.print(_acceptance_text(res))
    for line in dict.fromkeys(r["spread"]["line"] for r in rows if r.get("spread")):
        out_console.print(line, markup=False, highlight=False, soft_wrap=True)
    if slo:
        out_console.print(_goodput_line(rows, slo), markup=False, highlight=False,
                          soft_wrap=True)  # fmt: skip


def _goodput_line(rows: list[dict[str, Any]], slo: dict[str, float]) -> str:
    """The SLO goodput counts against, and for one run its figure: the requests (latencies'
    warm-up left out) meeting every limit, as bench counts them."""
    from speclens.sim.decide import slo_text

    head = f"goodput: the requests meeting every limit of the SLO ({slo_text(slo)})"
    good = rows[0].get("goodput") if len(rows) == 1 else None
    if good is None:
        return head + ", a share of each point's"
    return (f"{head}: {good['requests']:,} ({good['fraction']:.1%}), "
            f"{good['requests_per_s']:.2f} req/s")  # fmt: skip


def _acceptance_text(res: dict[str, Any], where: str = "") -> str:
    """``acceptance: AL 2.5 from the profile layer (set: key); source: ...``: the AL a run
    used and where it came from (``where``, `` at K 3``, when a line a K)."""
    return (
        f"acceptance{where}: AL {res['acceptance_length']:g} from the {res['layer']} layer"
        + (f" ({res['profile_set']}: {res['profile']})" if res.get("profile") else "")
        + (
            f", drafting on {res['draft_coverage']:g} of decode steps"
            if res["draft_coverage_stated"]
            else ""
        )
        + (f"; source: {res['source']}" if res.get("source") else "")
    )


def _warmup_lines(rows: list[dict[str, Any]], axes: list[str]) -> list[str]:
    """What the latencies left out: the one run's line, or for a sweep the rule once and the
    points too short to leave out theirs."""
    notes = [r.get("warmup") for r in rows]
    lines = {n["line"] for n in notes if n}
    if len(lines) <= 1:
        return sorted(lines)
    out = []
    if any(n and n["requests"] for n in notes):
        out.append("latencies leave out each point's warm-up: its first requests (as many as "
                   "its concurrency), admitted at once into idle engines at the start; "
                   "throughput and acceptance count every request (warmup in --json)")  # fmt: skip
    short = [" ".join(f"{a}={r['sweep'][a]}" for a in axes) for r, n in zip(rows, notes,
             strict=True) if n and not n["requests"]]  # fmt: skip
    if short:
        out.append(f"latencies include the start-up burst at {', '.join(short)}: a warm-up as "
                   "large as the concurrency would leave no request; raise workload.requests "
                   "above it to leave it out")  # fmt: skip
    return out


def _pricing(p: dict[str, Any]) -> str:
    if p["kind"] != "roofline":
        return (
            f"step cost {p['source']} (base {p['base']:g} s, per_token {p['per_token']:g} s, "
            f"per_seq {p['per_seq']:g} s, per_context_token {p['per_context_token']:g} s)"
        )
    e = p["efficiency"]
    return (
        f"roofline of {p['model']} on {p['parallel']} x {p['chip']} (weights "
        f"{p['weights_gb']:,.1f} GB, KV {p['kv_cache_tokens']:,} tokens; efficiency compute "
        f"{e['compute']:g}, memory {e['memory']:g}, overhead {e['overhead'] * 1e3:g} ms)"
    )


#: How a point's label names each axis on the plot ("K=4 c=64").
SHORT_AXIS = {"num_spec_tokens": "K", "concurrency": "c"}


def _figure(rows: list[dict[str, Any]], axes: list[str]) -> Any:
    """Throughput against TPOT, one line per K of a K x concurrency grid; each point labelled
    beside itself, with margins so no marker or label is cut at the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.5))
    FigureCanvasAgg(fig)  # no pyplot: no global state
    ax = fig.add_subplot()
    series: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        key = r["sweep"][axes[0]] if len(axes) > 1 else None
        series.setdefault(key, []).append(r)
    for key, group in series.items():
        xs = [r["latency_ms"]["tpot"]["p50"] if r["latency_ms"]["tpot"] else float("nan")
              for r in group]  # fmt: skip
        ys = [r["throughput"]["output_tokens_per_s"] for r in group]
        name = None if key is None else f"{SHORT_AXIS.get(axes[0], axes[0])}={key}"
        ax.plot(xs, ys, marker="o", label=name)
        for r, x, y in zip(group, xs, ys, strict=True):
            text = " ".join(f"{SHORT_AXIS.get(a, a)}={r['sweep'][a]}" for a in axes)
            ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
    ax.margins(x=0.08, y=0.1)
    ax.set_xlabel("TPOT p50 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput against latency\nsweeping " + " x ".join(axes), fontsize=10)
    if len(series) > 1:
        from speclens.runs.html_plots import legend_outside

        legend_outside(fig, ax)
    return fig


def _plot(rows: list[dict[str, Any]], axes: list[str], path: Path) -> None:
    fig = _figure(rows, axes)
    try:  # tight: a label past the axes stays in the image
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as exc:
        fail(f"--plot: {path}: cannot write: {exc.strerror or exc}")
