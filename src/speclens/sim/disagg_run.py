"""A scenario's disaggregated deployment (one prefill pool, one decode pool) run in its steady
state (``speclens.sim.disagg``), the model of record for such a deployment: no engine steps.

The two pools become ``disagg.Pools`` from their rooflines (the prefill pool's without a
drafter: only the decode pool speculates); the load is the workload's (a closed loop at its
concurrency, or an open one at its rate), at the decode pool's K and the AL resolved for it;
the requests' lengths are the workload's own, drawn as ``simulate.arrivals`` draws them. A
point's figures are ``disagg.figures``'; this module adds what a run prints and writes around
them (pricing, the layout, what bounds the loop), the sweep's pool axes, and the decision over
prefill:decode splits and K at a target interactivity.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from speclens.acceptance import Problem, ValidationError, read_yaml
from speclens.sim import disagg, limits
from speclens.sim.closed_loop import MAX_REQUESTS, Load
from speclens.sim.scenario import (
    Scenario,
    cost_source,
    layout_problems,
    roofline,
    roofline_problems,
)

#: A sweep axis over a pool's field: ``deployment.pools[I].replicas`` (or ``.workers``, the
#: same field) or ``deployment.pools[I].parallel``.
POOL_AXIS = re.compile(r"deployment\.pools\[(\d{1,3})\]\.(replicas|workers|parallel)")


def pool_axis(name: str) -> tuple[int, str] | None:
    """(pool index, field) of a pool sweep axis (``workers`` read as ``replicas``), or None."""
    found = POOL_AXIS.fullmatch(name)
    if found is None:
        return None
    field = "replicas" if found.group(2) == "workers" else found.group(2)
    return int(found.group(1)), field


def states_disaggregated(path: Path) -> bool:
    """Whether the scenario file states a prefill or decode pool (read, not validated: the
    command routes on it, and ``load_scenario`` then refuses what it cannot run)."""
    try:
        data = read_yaml(path)
    except ValidationError:
        return False
    deployment = data.get("deployment") if isinstance(data, dict) else None
    pools = deployment.get("pools") if isinstance(deployment, dict) else None
    if not isinstance(pools, list):
        return False
    return any(isinstance(p, dict) and p.get("role") in ("prefill", "decode") for p in pools)


def indices(scenario: Scenario) -> tuple[int, int]:
    """The prefill pool's index and the decode pool's (``layout_problems`` holds one each)."""
    roles = [p.role for p in scenario.deployment.pools]
    return roles.index("prefill"), roles.index("decode")


def with_layout(scenario: Scenario, point: Mapping[str, int]) -> Scenario:
    """``scenario`` with a sweep point's pool axes (``deployment.pools[I].replicas`` or
    ``.parallel``) in place of the pools' own."""
    pools = list(scenario.deployment.pools)
    for name, value in point.items():
        axis = pool_axis(name)
        if axis is not None:
            index, field = axis
            pools[index] = pools[index].model_copy(update={field: value})
    deployment = scenario.deployment.model_copy(update={"pools": pools})
    return scenario.model_copy(update={"deployment": deployment})


def layout_check(scenario: Scenario, base: Path, file: str) -> list[Problem]:
    """Every problem a layout (a sweep point's) has, as ``load_scenario`` finds them: the pools'
    roles and widths (``layout_problems``), then each pool's roofline (experts spread, weights
    that fit a worker)."""
    found = layout_problems(scenario, file)
    if found:
        return found
    for i, pool in enumerate(scenario.deployment.pools):
        found += roofline_problems(roofline(scenario, pool, base, file, i), pool, file, i)
    return found


def pools(scenario: Scenario, base: Path, file: str, k: int | None = None) -> disagg.Pools:
    """The deployment as ``disagg.Pools``, as a published disaggregated point's become
    (``fit_points.pools``): each pool's roofline at its own width, EP and DP attention; the
    prefill pool's without a drafter (only the decode pool speculates) and at its own compute
    efficiency where the efficiencies state one (``fit_points.pools_at``); the decode pool's
    without a drafter at K ``k`` 0 (a sweep's point without speculation)."""
    from speclens.sim.fit_points import pools_at

    p, d = indices(scenario)
    stated = scenario.deployment.pools
    prefill = replace(roofline(scenario, stated[p], base, file, p), method=None, drafter=None)
    decode = roofline(scenario, stated[d], base, file, d)
    if k == 0:
        decode = replace(decode, method=None, drafter=None)
    return pools_at(disagg.Pools(prefill, decode, stated[p].replicas, stated[d].replicas))


def drawn(scenario: Scenario, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The workload's (prompt, output) lengths, drawn as ``simulate.arrivals`` draws them."""
    from speclens.sim.simulate import arrivals

    requests = list(arrivals(scenario.workload, seed))
    inputs = np.array([r.input_tokens for r in requests], dtype=np.int64)
    outputs = np.array([r.output_tokens for r in requests], dtype=np.int64)
    return inputs, outputs


def load(scenario: Scenario, k: int, al: float, concurrency: int | None = None) -> Load:
    """The workload as ``closed_loop.Load``: closed at ``concurrency`` (else the workload's;
    an open loop passes its rate to ``disagg.figures`` and runs at concurrency 1, which it does
    not read), at K ``k`` and AL ``al``, a prefill step carrying up to the prefill pool's step
    budget (``limits.batched_tokens``, as its engine would)."""
    workload = scenario.workload
    p, _ = indices(scenario)
    return Load(
        concurrency=concurrency or workload.concurrency or 1,
        input_tokens=limits.longest(workload.input_tokens),
        output_tokens=limits.longest(workload.output_tokens),
        num_spec_tokens=k, acceptance_length=al,
        budget=limits.batched_tokens(scenario.deployment.pools[p]), requests=workload.requests,
    )  # fmt: skip


def rate(scenario: Scenario, concurrency: int | None) -> float | None:
    """The open loop's rate: the workload's, unless a concurrency closes the loop."""
    return None if concurrency or scenario.workload.concurrency else scenario.workload.rate


def problems(scenario: Scenario, file: str, concurrencies: Sequence[int] = ()) -> list[Problem]:
    """What the steady state cannot run as the workload states it (before any solving): no
    arrival process (neither concurrency nor rate, nor a concurrency swept), a bursty open
    loop, more requests than lengths are drawn for, requests longer than a pool's
    ``max_model_len``."""
    workload, out = scenario.workload, []
    if workload.concurrency is None and workload.rate is None and not concurrencies:
        out.append(Problem(file, "workload.concurrency", (
            "is not set, nor workload.rate: a disaggregated deployment is solved in its steady "
            "state, closed at a concurrency or open at a rate; give one"
        )))  # fmt: skip
    if workload.rate is not None and workload.burstiness != 1 and not concurrencies:
        out.append(Problem(file, "workload.burstiness", (
            f"is {workload.burstiness:g}: the disaggregated steady state queues prompts as "
            "deterministic batches at the mean rate, so it models no burstiness; leave it at 1"
        )))  # fmt: skip
    if workload.requests > MAX_REQUESTS:
        out.append(Problem(file, "workload.requests", (
            f"is {workload.requests:,}: the steady state draws lengths for at most "
            f"{MAX_REQUESTS:,} requests"
        )))  # fmt: skip
    inputs = limits.longest(workload.input_tokens)
    outputs = limits.longest(workload.output_tokens)
    p, d = indices(scenario)
    for index, need in ((p, inputs + 1), (d, inputs + outputs)):
        engine = scenario.deployment.pools[index].engine
        if need > engine.max_model_len:
            out.append(Problem(file, f"deployment.pools[{index}].engine.max_model_len", (
                f"is {engine.max_model_len}, but a request may need {need} tokens here "
                "(workload.input_tokens and output_tokens at their longest): raise it or "
                "shorten the workload"
            )))  # fmt: skip
    return out


def decode_k(scenario: Scenario) -> tuple[int, str | None]:
    """The decode pool's K and method (0 and None: it does not speculate)."""
    _, d = indices(scenario)
    spec = scenario.deployment.pools[d].engine.speculative
    return (spec.num_spec_tokens, spec.method) if spec is not None else (0, None)


def describe_pools(priced: disagg.Pools) -> dict[str, dict[str, Any]]:
    """Each pool's layout under a published disaggregated point's names (``speclens import``
    writes them): tensor_parallel, expert_parallel, dp_attention, workers and gpus."""
    return {
        name: {"tensor_parallel": roof.parallel, "expert_parallel": roof.expert_parallel,
               "dp_attention": roof.dp_attention, "workers": workers,
               "gpus": workers * roof.parallel}
        for name, roof, workers in (("prefill", priced.prefill, priced.prefill_workers),
                                    ("decode", priced.decode, priced.decode_workers))
    }  # fmt: skip


def layout_name(layout: Mapping[str, Mapping[str, Any]], k: int) -> str:
    """A configuration's name: ``p2xtp4-ep4-dpa-d1xtp8-ep8-k3`` (each pool's workers, TP, EP
    over 1 and DP attention, as ``speclens import`` names a published layout; then K)."""

    def one(tag: str, pool: Mapping[str, Any]) -> str:
        ep = f"-ep{pool['expert_parallel']}" if pool["expert_parallel"] > 1 else ""
        return f"{tag}{pool['workers']}xtp{pool['tensor_parallel']}{ep}" + (
            "-dpa" if pool["dp_attention"] else "")  # fmt: skip

    return f"{one('p', layout['prefill'])}-{one('d', layout['decode'])}-k{k}"


def layout_text(layout: Mapping[str, Mapping[str, Any]]) -> str:
    """``prefill 2 x TP 4 (EP 4, DP attention) : decode 1 x TP 8 (EP 8)``."""

    def one(pool: Mapping[str, Any]) -> str:
        extra = [f"EP {pool['expert_parallel']}"] if pool["expert_parallel"] > 1 else []
        extra += ["DP attention"] if pool["dp_attention"] else []
        return f"{pool['workers']} x TP {pool['tensor_parallel']}" + (
            f" ({', '.join(extra)})" if extra else "")  # fmt: skip

    return f"prefill {one(layout['prefill'])} : decode {one(layout['decode'])}"


def run(
    scenario: Scenario, base: Path, file: str, seed: int, k: int, al: float,
    concurrency: int | None = None, lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One point: ``disagg.solve``'s figures and steady state for the scenario's pools, load
    and drawn lengths (``lengths``: ``drawn``'s at ``seed``, drawn once for a sweep), as a row
    (figures as an aggregate-only run states them, in ms). Raises ``disagg.OverloadedError``
    for an open loop past what the pools serve."""
    priced = pools(scenario, base, file, k)
    planned = load(scenario, k, al, concurrency)
    lengths = lengths if lengths is not None else drawn(scenario, seed)
    open_rate = rate(scenario, concurrency)
    figures, state = disagg.solve(planned, priced, rate=open_rate, drawn=lengths)
    block = figures.summary_figures()
    block["throughput"]["requests_per_s"] = state.requests_per_s
    p, d = indices(scenario)
    stated = scenario.deployment.pools
    pricing = {
        name: {"pool": i, **roof.describe(), "kv_cache_tokens": roof.kv_tokens(),
               "source": cost_source(stated[i], scenario)}
        for name, i, roof in (("prefill", p, priced.prefill), ("decode", d, priced.decode))
    }  # fmt: skip
    return {
        "loop": "steady",
        "requests": len(lengths[1]),
        "concurrency": None if open_rate is not None else planned.concurrency,
        "request_rate": open_rate,
        "makespan_s": figures.duration_s,
        "gpus": priced.gpus,
        "num_spec_tokens": k,
        "acceptance_length": al,
        "latency_ms": block["latency_ms"],
        "throughput": block["throughput"],
        "interactivity": block["interactivity"],
        "steady": disagg.describe(state),
        "layout": describe_pools(priced),
        "pricing": pricing,
        "max_num_seqs": stated[d].engine.max_num_seqs,
    }


def pricing_text(name: str, p: Mapping[str, Any]) -> str:
    """How a pool's steps were priced, in one line."""
    e = p["efficiency"]
    dpa = ", DP attention" if p["dp_attention"] else ""
    return (
        f"{name} pool (deployment.pools[{p['pool']}]) steps: roofline of {p['model']} on "
        f"{p['parallel']} x {p['chip']} a worker (EP {p['expert_parallel']}{dpa}; KV "
        f"{p['kv_cache_tokens']:,} tokens a worker; efficiency compute {e['compute']:g}, memory "
        f"{e['memory']:g}, interconnect {e['interconnect']:g}, overhead "
        f"{e['overhead'] * 1e3:g} ms)" + (f"; drafter {p['method']}" if p["method"] else "")
    )


def bound_text(row: Mapping[str, Any]) -> str:
    """What bounds the loop, with the decode batch a worker holds."""
    s = row["steady"]
    why = {"decode": "the decode pool's steps", "prefill": "the prefill pool (prompts queue "
           "for it)", "kv cache": "the decode workers' KV cache (clients queue for it)"}  # fmt: skip
    line = (f"bound by {why.get(s['bound'], s['bound'])}: a decode worker holds "
            f"{s['decode_batch']:,.1f} requests, a decode step {s['step_ms']:.2f} ms")  # fmt: skip
    if s["decode_batch"] > row["max_num_seqs"]:
        line += (f" (over its max_num_seqs {row['max_num_seqs']}: the steady state caps the "
                 "batch at the KV cache only)")  # fmt: skip
    return line


def settings(
    scenario: Scenario, file: str, seed: int, row: Mapping[str, Any],
    resolution: Mapping[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """An aggregate-only prediction's settings, under a published disaggregated point's names
    (``speclens import`` writes them), so ``compare`` sets it beside one: the decode pool's
    TP, EP and DP attention at the top, both pools' GPUs, and each pool's layout."""
    from speclens.runs.rundir import SETTINGS_SCHEMA
    from speclens.sim.run_output import SIMULATED, workload_sha256

    workload, layout = scenario.workload, row["layout"]
    k = row["num_spec_tokens"]
    _, method = decode_k(scenario)

    def lengths(spec: int | Any) -> dict[str, int]:
        return ({"min": spec, "max": spec} if isinstance(spec, int)
                else {"min": spec.min, "max": spec.max})  # fmt: skip

    return {
        "model": scenario.model, "hardware": row["pricing"]["decode"]["chip"],
        "engine": None, "precision": scenario.precision,
        "tensor_parallel": layout["decode"]["tensor_parallel"],
        "expert_parallel": layout["decode"]["expert_parallel"],
        "dp_attention": layout["decode"]["dp_attention"], "gpus": row["gpus"],
        "disaggregated": True, "prefill": dict(layout["prefill"]),
        "decode": dict(layout["decode"]),
        "input_tokens": lengths(workload.input_tokens),
        "output_tokens": lengths(workload.output_tokens),
        "max_tokens": limits.longest(workload.output_tokens),
        "concurrency": row["concurrency"], "request_rate": row["request_rate"],
        "method": method if k else None, "num_spec_tokens": k or None,
        "acceptance_source": (resolution or {}).get("source"),
        "ignore_eos": True, "temperature": 0.0, "sampling": SIMULATED, "dataset": "sim",
        "prompts_sha256": workload_sha256(scenario), "num_requests": row["requests"],
        "executor": "sim", "loop": "steady", "scenario": file, "seed": seed,
        "settings_schema": SETTINGS_SCHEMA,
    }  # fmt: skip


def summary(
    scenario: Scenario, file: str, seed: int, row: Mapping[str, Any],
    resolution: Mapping[str, Any] | None, trust: Mapping[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """summary.json of an aggregate-only prediction, as ``sim --trace`` on published points
    writes one (``runs.published.write_point``): the steady state's figures, its settings,
    what priced it and how far to trust it."""
    from speclens import __version__

    k = row["num_spec_tokens"]
    figures = {"aggregate_only": True, "latency_ms": row["latency_ms"],
               "throughput": row["throughput"], "interactivity": row["interactivity"],
               "acceptance": ({"acceptance_length": row["acceptance_length"],
                               "num_spec_tokens": k} if k else None)}  # fmt: skip
    return {
        "aggregate_only": True,
        "settings": settings(scenario, file, seed, row, resolution),
        "server": {"engine": "speclens", "version": __version__, "executor": "sim",
                   "model": scenario.model, "hardware": row["pricing"]["decode"]["chip"]},
        "provenance": {"source": "speclens-sim", "scenario": file,
                       "priced_with": {"prefill": row["pricing"]["prefill"],
                                       "decode": row["pricing"]["decode"]},
                       "trust": trust, "notes": [bound_text(row)]},
        "simulation": {"loop": "steady", "steady": row["steady"], "requests": row["requests"],
                       "duration_s": row["makespan_s"]},
        "figures": figures,
    }  # fmt: skip


# ------------------------------------------------------------------ the decision over splits
def decide(
    rows: Sequence[Mapping[str, Any]], target: float, method: str | None = None,
    trust: Mapping[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The best prefill:decode split and K at ``target`` tok/s/user: each configuration's
    (layout and K) points over concurrency as output tok/s/GPU (its own GPUs: both pools')
    against tok/s/user (1000 / mean TPOT), its Pareto curve read at ``target`` by compare's
    functions (``sim.decide.pareto`` and ``at``: never extrapolated); the highest wins, a tie
    to the fewer GPUs. ``trust`` (``run_output.combined``'s) adds each figure's band."""
    from speclens.sim import decide as dk
    from speclens.sim.trust import Errors, Trust

    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(layout_name(row["layout"], row["num_spec_tokens"]), []).append(row)
    entries = []
    for name, group in groups.items():
        points = [(1000.0 / tpot, r["throughput"]["output_tokens_per_s_per_gpu"])
                  for r in group if (tpot := r["latency_ms"]["tpot"]["mean"]) > 0]  # fmt: skip
        curve = dk.pareto(points)
        value = dk.at(curve, target)
        first = group[0]
        entry: dict[str, Any] = {
            "configuration": name, "layout": first["layout"],
            "num_spec_tokens": first["num_spec_tokens"],
            "acceptance_length": first["acceptance_length"], "gpus": first["gpus"],
            "tok_s_gpu": value,
            "curve": [{"tok_s_user": x, "tok_s_gpu": y} for x, y in curve],
        }  # fmt: skip
        if value is None:
            span = f"{curve[0][0]:,.1f} to {curve[-1][0]:,.1f} tok/s/user" if curve else "no points"
            entry["reason"] = f"its curve spans {span}, not {target:g}"
        entries.append(entry)
    reached = [e for e in entries if e["tok_s_gpu"] is not None]
    best = max(reached, key=lambda e: (e["tok_s_gpu"], -e["gpus"])) if reached else None
    errors = (trust or {}).get("expected_error")
    for e in entries:
        value = e["tok_s_gpu"]
        e["ratio_to_best"] = value / best["tok_s_gpu"] if best and value is not None else None
        band = None
        if isinstance(errors, dict) and value is not None and trust is not None:
            stated = Trust(str(trust.get("basis")), str(trust.get("line")),
                           expected=Errors(**errors))  # fmt: skip
            band = stated.band("throughput", value)
        e["expected_low"], e["expected_high"] = band or (None, None)
    return {
        "tok_s_user": target, "interval": dk.NO_INTERVAL,
        "best": best["configuration"] if best else None,
        "best_tok_s_gpu": best["tok_s_gpu"] if best else None,
        "configurations": entries, "headline": headline(entries, best, target),
        "flags": flags(best["layout"], best["num_spec_tokens"], method) if best else None,
        "trust": dict(trust) if trust else None,
    }  # fmt: skip


def headline(entries: Sequence[Mapping[str, Any]], best: Mapping[str, Any] | None,
             target: float) -> str:  # fmt: skip
    """The decision in one line."""
    if best is None:
        return (f"at {target:g} tok/s/user: no configuration's curve reaches it (each spans "
                "the interactivity its concurrencies reach; sweep other concurrencies)")  # fmt: skip
    runner = max((e for e in entries if e is not best and e["tok_s_gpu"] is not None),
                 key=lambda e: e["tok_s_gpu"], default=None)  # fmt: skip
    line = (f"at {target:g} tok/s/user, {layout_text(best['layout'])} at "
            f"{_k_text(best['num_spec_tokens'])} delivers {best['tok_s_gpu']:,.0f} "
            f"{_UNIT} on {best['gpus']} GPUs")  # fmt: skip
    if runner is not None:
        gain = best["tok_s_gpu"] / runner["tok_s_gpu"] - 1 if runner["tok_s_gpu"] else math.inf
        line += (f", {gain:+.1%} over the next best ({layout_text(runner['layout'])} at "
                 f"{_k_text(runner['num_spec_tokens'])})")  # fmt: skip
    return line


_UNIT = "output tok/s/GPU"


def _k_text(k: int) -> str:
    return f"K {k}" if k else "K 0 (no speculation)"


def flags(layout: Mapping[str, Mapping[str, Any]], k: int, method: str | None) -> list[str]:
    """The layout as SGLang's disaggregated serving flags (as Dynamo launches its workers),
    one line a pool: its worker count, then each worker's ``--disaggregation-mode``,
    ``--tp-size``, ``--ep-size`` (EP > 1), ``--enable-dp-attention --dp-size`` (DP attention
    over the worker's GPUs), and on the decode pool the speculative flags
    ``acceptance.emit.serving`` writes for K (every value shell-quoted; a method SGLang has
    no name for is said so in its place)."""
    from speclens.acceptance.emit import EmitRefused, serving

    out = []
    for name in ("prefill", "decode"):
        pool = layout[name]
        parts = ["--disaggregation-mode", name, "--tp-size", str(pool["tensor_parallel"])]
        if pool["expert_parallel"] > 1:
            parts += ["--ep-size", str(pool["expert_parallel"])]
        if pool["dp_attention"]:
            parts += ["--enable-dp-attention", "--dp-size", str(pool["tensor_parallel"])]
        line = " ".join(shlex.quote(p) for p in parts)
        if name == "decode" and k and method is not None:
            try:
                line += " " + serving("sglang", method, k).line
            except EmitRefused as exc:
                line += f" (no speculative flags: {exc})"
        workers = pool["workers"]
        out.append(f"{name}: {workers} worker{'s' if workers != 1 else ''}, each: {line}")
    return out
