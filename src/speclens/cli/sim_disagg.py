"""``speclens sim SCENARIO.yaml`` on a disaggregated deployment (a prefill pool and a decode
pool): each point solved in its steady state (``speclens.sim.disagg_run``), printed as a
scenario's run is, with ``--sweep`` over the pools' workers and widths, K and concurrency, and
``--at-interactivity`` naming the best split and K with its serving flags."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from speclens.cli._common import (
    cli_value,
    err_console,
    fail,
    load_registry,
    out_console,
    reported,
)


@dataclass(frozen=True)
class Flags:
    """The ``sim`` options a disaggregated run reads or refuses."""

    at_interactivity: float | None
    context: str | None
    emit: str | None
    plot: Path | None
    exact: bool
    ray: str | None
    seed: int
    as_json: bool
    output_dir: Path | None
    precision: str | None
    registry: list[Path]
    values: tuple[Any, Any, Any]


def _refuse_flags(flags: Flags, axes: list[str]) -> None:
    """What a steady state does not take, one line each, exit 2, before the scenario is read."""
    if flags.exact:
        fail("--exact: a disaggregated deployment is modelled by its steady state "
             "(sim/disagg.py), not stepped: there is no step-exact loop of it", code=2)  # fmt: skip
    if flags.context is not None or flags.emit is not None:
        fail("--context and --emit schedule K on a single-node deployment; a disaggregated "
             "one names its split and K with --sweep and --at-interactivity", code=2)  # fmt: skip
    if flags.plot is not None:
        fail("--plot does not go with a disaggregated scenario: --output-dir writes each "
             "configuration's sweep, whose report.html plots it", code=2)  # fmt: skip
    if flags.ray is not None:
        fail("--ray: a disaggregated point is solved in this process (under a millisecond a "
             "point): there is nothing to fan out", code=2)  # fmt: skip
    target = flags.at_interactivity
    if target is not None and "concurrency" not in axes:
        fail("--at-interactivity needs --sweep concurrency=...: each configuration's curve runs "
             "over concurrency", code=2)  # fmt: skip
    if target is not None and not 0 < target < float("inf"):
        fail(f"--at-interactivity: expected tok/s/user > 0, got {target:g}", code=2)
    out = flags.output_dir
    if out is not None and (out.is_symlink() or (out.exists() and not out.is_dir())):
        fail(f"command line: --output-dir: {out}: exists and is not a directory", code=2)
    if out is not None and out.is_dir() and any(out.iterdir()):
        fail(f"command line: --output-dir: {out}: exists and is not empty", code=2)


def disagg_command(path: Path, axes: list[str], grid: list[dict[str, int]], flags: Flags) -> None:
    from speclens.acceptance import WorkloadAcceptance, resolve
    from speclens.sim import disagg_run as dr
    from speclens.sim.disagg import OverloadedError
    from speclens.sim.run_output import run_trust
    from speclens.sim.scenario import load_scenario

    _refuse_flags(flags, axes)
    file, base = str(path), path.parent
    with reported():
        scenario = load_scenario(path, flags.precision)
    own_k, method = dr.decode_k(scenario)
    _, d = dr.indices(scenario)
    ks = sorted({g["num_spec_tokens"] for g in grid if "num_spec_tokens" in g}) or [own_k]
    if method is None and any(ks):
        fail(f"command line: --sweep: num_spec_tokens with {path}: deployment.pools[{d}] does "
             "not speculate (engine.speculative): only K 0 runs", code=2)  # fmt: skip
    concurrencies = sorted({g["concurrency"] for g in grid if "concurrency" in g})
    problems = []
    for axis in axes:
        found = dr.pool_axis(axis)
        if found is not None and found[0] >= len(scenario.deployment.pools):
            problems.append(f"command line: --sweep: {axis}: {path} has "
                            f"{len(scenario.deployment.pools)} pools")  # fmt: skip
    if problems:
        fail(problems, code=2)
    layouts: dict[str, Any] = {}
    for g in grid:
        pooled = {a: v for a, v in g.items() if a.startswith("deployment.")}
        key = json.dumps(pooled, sort_keys=True)
        if key in layouts:
            continue
        own = dr.with_layout(scenario, pooled)
        with reported():
            found_problems = dr.layout_check(own, base, file)
        if found_problems:
            point = " ".join(f"{a}={v}" for a, v in pooled.items())
            fail([f"command line: --sweep: {point} with {p}" for p in found_problems], code=2)
        layouts[key] = own
    with reported():
        from speclens.acceptance import ValidationError

        stated = dr.problems(scenario, file, concurrencies)
        if stated:
            raise ValidationError(stated)
        reg = load_registry(flags.registry)
        resolved: dict[int, Any] = {}
        for k in ks:
            if not k or method is None:
                continue
            workload = scenario.workload
            resolved[k] = resolve(
                model=scenario.model, method=method, num_spec_tokens=k,
                hardware=scenario.hardware, registry=reg,
                workload=WorkloadAcceptance(thinking=workload.thinking, category=workload.category,
                                            acceptance=workload.acceptance),
                scenario=scenario.acceptance, cli=cli_value(k, *flags.values),
            )  # fmt: skip
        trusts = {k: run_trust(scenario, base, k) for k in ks}
    for k, res in resolved.items():
        if res.draft_coverage < 1:
            where = {"workload": f"{path}: workload.acceptance.draft_coverage",
                     "scenario": f"{path}: acceptance.value.draft_coverage",
                     "cli": "command line: acceptance"}.get(
                         res.layer, f"{path}: acceptance ({res.profile_set}: {res.profile})")  # fmt: skip
            fail(f"{where}: drafts on {res.draft_coverage:g} of decode steps at K {k}: the "
                 "disaggregated steady state drafts on every decode step; state an AL at "
                 "coverage 1")  # fmt: skip
    rows = []
    lengths = dr.drawn(scenario, flags.seed)  # the workload's, the same at every point
    for g in grid or [{}]:
        pooled = {a: v for a, v in g.items() if a.startswith("deployment.")}
        own = layouts[json.dumps(pooled, sort_keys=True)] if layouts else scenario
        k = g.get("num_spec_tokens", own_k)
        res = resolved.get(k)
        al = res.acceptance_length if res is not None else 1.0
        try:
            with reported():
                row = dr.run(own, base, file, flags.seed, k, al, g.get("concurrency"), lengths)
        except OverloadedError as exc:
            at = " ".join(f"{a}={v}" for a, v in g.items())
            fail(f"{path}: workload.rate: {exc}" + (f" (at {at})" if at else "") + ": the "
                 "open loop's queues grow without bound")  # fmt: skip
        row["resolution"] = res.model_dump() if res is not None else None
        row["spread"] = _spread(res)
        row["trust"] = trusts[k]
        if axes:
            row["sweep"] = dict(g)
        rows.append(row)
    decision = None
    if flags.at_interactivity is not None:
        from speclens.sim.run_output import combined

        said = combined([(f"K {k}", trusts[k]) for k in ks])
        decision = dr.decide(rows, flags.at_interactivity, method, said)
    if flags.as_json:
        document: Any = rows if axes else rows[0]
        if decision is not None:
            document = {"decision": decision, "points": rows}
        typer.echo(json.dumps(document, indent=2))
    else:
        if decision is not None:
            _print_decision(decision)
        _print(rows, axes, _labels(scenario, axes), trust=decision is None)
    if flags.output_dir is not None:
        _write(flags.output_dir, scenario, file, flags.seed, rows, axes, decision, flags.as_json)


def _spread(res: Any) -> dict[str, Any] | None:
    """What the tails rest on: the steady state prices the mean AL alone, so a stated spread is
    named and said to be left out, and none stated is the usual ``SPREAD_UNKNOWN``."""
    from speclens.acceptance.spread import SPREAD_UNKNOWN

    if res is None:
        return None
    if res.spread is None:
        return {"simulated": False, "line": SPREAD_UNKNOWN}
    q = res.spread.quantiles
    return {"simulated": False,
            "line": f"spread: stated (p10 {q['p10']:.2f}, p50 {q['p50']:.2f}, p90 {q['p90']:.2f} "
                    "over requests) but not simulated: the steady state prices the mean AL, so "
                    "its tails are minimum-variance, optimistic"}  # fmt: skip


def _acceptance_text(res: dict[str, Any], where: str = "") -> str:
    """``acceptance at K 3: AL 2.5 from the workload layer; source: ...`` (as a scenario's run
    says it)."""
    return (
        f"acceptance{where}: AL {res['acceptance_length']:g} from the {res['layer']} layer"
        + (f" ({res['profile_set']}: {res['profile']})" if res.get("profile") else "")
        + (f"; source: {res['source']}" if res.get("source") else "")
    )


def _say(text: str) -> None:
    out_console.print(text, markup=False, highlight=False, soft_wrap=True)


def _labels(scenario: Any, axes: list[str]) -> list[str]:
    """Each sweep axis as a column names it: ``prefill workers``, ``decode TP``, ``K``."""
    from speclens.sim.disagg_run import pool_axis

    out = []
    for axis in axes:
        found = pool_axis(axis)
        if found is None:
            out.append("K" if axis == "num_spec_tokens" else axis)
            continue
        role = scenario.deployment.pools[found[0]].role
        out.append(f"{role} {'workers' if found[1] == 'replicas' else 'TP'}")
    return out


def _print(rows: list[dict[str, Any]], axes: list[str], labels: list[str],
           trust: bool = True) -> None:  # fmt: skip
    """The figures' table, then the layout, what bounds each point, how each pool was priced,
    the AL used and how far to trust the figures (``trust``: unless the decision said it)."""
    from speclens.sim import disagg_run as dr

    table = Table(title="speclens sim (disaggregated, steady state)")
    for col in [*labels, "AL", "req/s", "out tok/s", "out tok/s/GPU", "TTFT p50", "TPOT p50",
                "ITL p99", "E2E p99", "bound", "decode batch"]:  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        lat, tput = r["latency_ms"], r["throughput"]
        table.add_row(
            *(str(r["sweep"][a]) for a in axes), f"{r['acceptance_length']:.3f}",
            f"{tput['requests_per_s']:.2f}", f"{tput['output_tokens_per_s']:,.0f}",
            f"{tput['output_tokens_per_s_per_gpu']:,.1f}",
            *(f"{lat[m][q]:.1f} ms" for m, q in (("ttft", "p50"), ("tpot", "p50"),
                                                 ("itl", "p99"), ("e2e", "p99"))),
            r["steady"]["bound"], f"{r['steady']['decode_batch']:,.1f}",
        )  # fmt: skip
    out_console.print(table)
    for line in dict.fromkeys(r["spread"]["line"] for r in rows if r.get("spread")):
        _say(line)
    first = max(rows, key=lambda r: r["num_spec_tokens"])  # its pricing names the drafter
    layouts = list(dict.fromkeys(dr.layout_text(r["layout"]) for r in rows))
    _say(f"steady state of a disaggregated deployment (sim/disagg.py: no warm-up, no step-exact "
         f"loop): {layouts[0]}, {first['gpus']} GPUs (throughput per GPU counts both pools)"
         if len(layouts) == 1 else f"steady state of a disaggregated deployment "
         f"(sim/disagg.py): {len(layouts)} layouts; throughput per GPU counts both pools' "
         "GPUs at each")  # fmt: skip
    if len(rows) == 1:
        _say(dr.bound_text(first))
    else:
        _say("bound: what stops the loop (the decode steps, the prefill pool, the decode "
             "workers' KV cache); decode batch: the requests a decode worker holds")  # fmt: skip
        over = [r for r in rows if r["steady"]["decode_batch"] > r["max_num_seqs"]]
        if over:
            _say(f"{len(over)} point(s) hold a decode batch over the decode pool's max_num_seqs "
                 f"{first['max_num_seqs']}: the steady state caps it at the KV cache only")  # fmt: skip
    for name in ("prefill", "decode"):
        _say(dr.pricing_text(name, first["pricing"][name]) + (
            " (one point's layout; each point is priced at its own)"
            if len(layouts) > 1 else ""))  # fmt: skip
    for line in dict.fromkeys(r["trust"]["line"] for r in rows if trust and r.get("trust")):
        _say(line)
    seen = {}
    for r in rows:
        if r["resolution"] is not None:
            seen[r["num_spec_tokens"]] = r["resolution"]
    for k, res in sorted(seen.items()):
        _say(_acceptance_text(res, f" at K {k}" if len(seen) > 1 else ""))
    if any(not r["num_spec_tokens"] for r in rows):
        _say("K 0: the decode pool does not speculate (AL 1)")


def _print_decision(decision: dict[str, Any]) -> None:
    """The decision's line first, then each configuration at the target, then the serving
    flags of the best and how far to trust the figures."""
    from speclens.sim import disagg_run as dr

    _say(decision["headline"])
    target = decision["tok_s_user"]
    table = Table(title=f"at {target:g} tok/s/user")
    entries = decision["configurations"]
    banded = any(e.get("expected_low") is not None for e in entries)
    for col in ("prefill : decode", "K", "AL", "GPUs", f"out tok/s/GPU at {target:g}",
                "ratio to best", *(["expected range"] if banded else [])):  # fmt: skip
        table.add_column(col, justify="right")
    for e in entries:
        value, low = e["tok_s_gpu"], e.get("expected_low")
        table.add_row(
            dr.layout_text(e["layout"]), str(e["num_spec_tokens"]),
            f"{e['acceptance_length']:.2f}", str(e["gpus"]),
            f"{value:,.0f}" if value is not None else e.get("reason", "-"),
            f"{e['ratio_to_best']:.3f}" if e["ratio_to_best"] is not None else "-",
            *([f"{low:,.0f} to {e['expected_high']:,.0f}" if low is not None else "-"]
              if banded else []),
        )  # fmt: skip
    out_console.print(table)
    _say(decision["interval"])
    for line in decision["flags"] or []:
        _say(f"sglang {line}")
    if decision.get("trust"):
        _say(decision["trust"]["line"])


def _write(out: Path, scenario: Any, file: str, seed: int, rows: list[dict[str, Any]],
           axes: list[str], decision: dict[str, Any] | None, quiet: bool) -> None:  # fmt: skip
    """Aggregate-only predictions (``runs.published``, as ``sim --trace`` on published points
    writes them): one run; one configuration's sweep over concurrency; or, where the sweep
    varies the split or K, one such sweep (or run, an open loop) a configuration, named by it
    (``disagg_run.layout_name``), with decision.json beside them."""
    from speclens.runs import published
    from speclens.runs.rundir import InputError
    from speclens.sim import disagg_run as dr

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        summary = dr.summary(scenario, file, seed, r, r["resolution"], r["trust"])
        groups.setdefault(dr.layout_name(r["layout"], r["num_spec_tokens"]), []).append(summary)
    closed = rows[0]["concurrency"] is not None
    try:
        if not axes:
            published.write_point(out, next(iter(groups.values()))[0])
        elif len(groups) == 1 and closed:
            published.write_sweep(out, next(iter(groups.values())))
        elif closed:
            published.write_sweeps(out, groups)
        else:
            for name, summaries in groups.items():
                published.write_point(out / name, summaries[0])
        if decision is not None:
            (out / "decision.json").write_text(json.dumps(decision, indent=2) + "\n")
    except InputError as exc:
        fail(exc.lines, code=exc.code)
    except OSError as exc:
        fail(f"{exc.filename or out}: cannot write: {exc.strerror or exc}")
    (err_console if quiet else out_console).print(f"wrote {out}", markup=False)
