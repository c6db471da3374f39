"""speclens's predictions against InferenceX's published DeepSeek-R1 runs on GPUs.

    python benchmarks/inferencex.py [--data ../shared/data/inferencex] [--jobs 2] [--json OUT]
        [--ray [ADDRESS]] [--write-trust PATH] [--section all|single|disagg]

The data (``benchmarks.json`` and ``benchmarks-history.json``: see its README) is imported as
``speclens import inferencex`` does. Every single-node deployment (chip, engine, precision,
lengths, TP/EP/DP-attention) with at least 3 MTP-off concurrencies on one date is scored, on its
date with the most concurrencies (the latest of ties):

- uncalibrated: the roofline at its chip's defaults, fitted on every other chip's points
  (leave one chip out: never scored on the points it was fitted on);
- held out: the roofline calibrated on the other MTP-off concurrencies, predicting the one left
  out (leave one concurrency out); the fit starts from the chip's leave-one-chip-out defaults,
  never from the chip's own (fitted on the point held out);
- MTP on, where the deployment has an MTP run: the AL inferred from its lowest concurrency (K as
  InferenceX's scripts set it), then its error at every other concurrency, and the predicted
  speedup (MTP-off TPOT over MTP-on TPOT, both predicted) against the measured one at each
  other concurrency both runs have (at the lowest the AL reproduces the measured MTP TPOT by
  construction, so it is not scored);
- beside them, the data's own spread: the same deployment's TPOT at one concurrency on different
  dates (max over min, less 1, the median over its concurrencies).

Errors are |predicted / measured - 1| of median TPOT, median TTFT and total throughput per GPU;
each figure is the median over deployments (each deployment's own median over its points).

Each chip's fits (leave one chip out, and its own defaults), then each deployment's scoring, is
one call of ``speclens.sim.fanout``: in ``--jobs`` processes, or with ``--ray`` as Ray tasks on a
local Ray (``--ray``) or on the cluster at ADDRESS (``--ray HOST:PORT``); the figures are the
same. ``own_defaults`` is what the catalog's chip entries ship (``tests/sim`` regenerates it).
The disaggregated runs are scored by ``benchmarks/inferencex_disagg.py`` (``--section disagg``
runs that alone). ``--write-trust PATH`` writes the figures as the accuracy table the package
states beside its predictions (``speclens.sim.trust``;
``src/speclens/registry/catalog/accuracy/inferencex.yaml``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from speclens.sim import catalog, fanout
from speclens.sim.closed_loop import schedule
from speclens.sim.fit_points import Fit, Point, PointsError, fit_pooled, infer_acceptance
from speclens.sim.roofline import Efficiency, Roofline

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "inferencex"
FILES = ("benchmarks.json", "benchmarks-history.json")
DEPLOYMENT = ("hardware", "framework", "precision", "isl", "osl", "decode_tp", "decode_ep",
              "decode_dp_attention")  # fmt: skip
GOALS = {"held_out_tpot": 0.10, "held_out_throughput": 0.10, "held_out_ttft": 0.25,
         "mtp_tpot": 0.15, "speedup": 0.15, "uncalibrated_tpot": 0.25}  # fmt: skip


def num_spec_tokens(engine: str, chip: str, dp_attention: bool) -> int:
    """K as InferenceX's MTP scripts set it (its data README's table)."""
    if engine == "sglang":
        return 2 if chip in ("h200", "b200", "b300") else 3
    if engine == "trt":
        return 1 if dp_attention else 3
    return 3


def _points(data: Path) -> list[dict[str, Any]]:
    seen, out = set(), []
    for name in FILES:
        for p in json.loads((data / name).read_text()):
            key = (p["run_url"], p["conc"], *(p[k] for k in DEPLOYMENT), p["spec_method"])
            if key not in seen and not p["disagg"]:
                seen.add(key)
                out.append(p)
    return out


def _point(p: dict[str, Any]) -> Point:
    m = p["metrics"]
    settings = {
        "model": "deepseek-r1", "hardware": p["hardware"], "engine": p["framework"],
        "precision": p["precision"], "tensor_parallel": p["decode_tp"],
        "expert_parallel": p["decode_ep"], "dp_attention": p["decode_dp_attention"],
        "gpus": p["decode_tp"], "disaggregated": False,
        "input_tokens": {"min": p["isl"], "max": p["isl"]},
        "output_tokens": {"min": p["osl"], "max": p["osl"]}, "concurrency": p["conc"],
        "method": None if p["spec_method"] == "none" else p["spec_method"], "date": p["date"],
    }  # fmt: skip
    return Point(Path(p["run_url"]), settings, m["median_tpot"], m["median_ttft"],
                 m["tput_per_gpu"])  # fmt: skip


def roofline(p: Point, chip_defaults: bool = True) -> Roofline:
    """The roofline a point ran on: DeepSeek-R1 at its precision, its chip and parallelism; at
    the chip's efficiency defaults (where a fit starts, as calibrate's does), or at the global
    ones (where the chips' own defaults are fitted from, so the fit never starts at its answer)."""
    s = p.settings
    model = catalog.with_precision(catalog.model("deepseek-r1"), s["precision"])
    return Roofline(model, catalog.chip(s["hardware"]), s["tensor_parallel"],
                    expert_parallel=s["expert_parallel"], dp_attention=s["dp_attention"],
                    efficiency=None if chip_defaults else Efficiency())  # fmt: skip


def _by_concurrency(points: Sequence[Point]) -> list[Point]:
    one: dict[int, Point] = {}
    for p in points:
        one.setdefault(p.concurrency, p)
    return [one[c] for c in sorted(one)]


def deployments(data: Path) -> list[dict[str, Any]]:
    """Each scored deployment: its MTP-off points of one date, its MTP points of one date (or
    none), and its MTP-off TPOTs on every date, by concurrency."""
    groups: dict[tuple[Any, ...], dict[str, dict[str, list[Point]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for raw in _points(data):
        key = tuple(raw[k] for k in DEPLOYMENT)
        groups[key][raw["spec_method"]][raw["date"]].append(_point(raw))
    out = []
    for key, by in sorted(groups.items()):
        off = {d: _by_concurrency(ps) for d, ps in by.get("none", {}).items()}
        off = {d: ps for d, ps in off.items() if len(ps) >= 3}
        if not off:
            continue
        date = max(off, key=lambda d: (len(off[d]), d))
        on = {d: _by_concurrency(ps) for d, ps in by.get("mtp", {}).items()}
        mtp_date = max(on, key=lambda d: (len(on[d]), d)) if on else None
        dates: dict[int, list[float]] = defaultdict(list)
        for ps in by.get("none", {}).values():
            for p in _by_concurrency(ps):
                dates[p.concurrency].append(p.tpot_s)
        out.append({"key": key, "date": date, "off": off[date],
                    "mtp_date": mtp_date, "on": on.get(mtp_date, []) if mtp_date else [],
                    "spread": [max(v) / min(v) - 1 for v in dates.values() if len(v) > 1]})  # fmt: skip
    return out


def _errors(points: Sequence[Point], fit: Fit, k: int = 0, al: float = 1.0) -> np.ndarray:
    """Per point, |predicted / measured - 1| of TPOT, TTFT, throughput per GPU."""
    rows = []
    roof = replace(fit.roofline, method="mtp") if k else fit.roofline
    for p in points:
        f = schedule(p.load(k, al)).figures(roof, fit.front_latency_s, p.gpus)
        rows.append([f.median_tpot_s / p.tpot_s - 1, f.median_ttft_s / p.ttft_s - 1,
                     f.throughput_per_gpu / p.throughput_per_gpu - 1])  # fmt: skip
    return np.abs(np.array(rows))


def _with_roofs(fit: Fit, points: Sequence[Point]) -> list[Fit]:
    """``fit``'s parameters on each point's own roofline."""
    e = fit.roofline.efficiency
    return [replace(fit, roofline=replace(roofline(p), efficiency=e)) for p in points]


def score(dep: dict[str, Any], start: dict[str, Any]) -> dict[str, Any]:
    """A deployment's held-out, MTP and speedup figures. The held-out fits start from
    ``start`` (the chip's leave-one-chip-out defaults and front latency: never fitted on this
    chip's points); the fit on every MTP-off point, from which the AL is inferred, from the
    chip's own defaults."""
    off: list[Point] = dep["off"]
    roof = roofline(off[0])
    front = start["front_latency_s"]
    unseen = replace(roof, efficiency=Efficiency(**{k: v for k, v in start.items()
                                                    if k != "front_latency_s"}))  # fmt: skip
    held = []
    for i, p in enumerate(off):
        rest = off[:i] + off[i + 1 :]
        held.append(_errors([p], fit_pooled(rest, [unseen] * len(rest), front))[0])
    full = fit_pooled(off, [roof] * len(off))
    row: dict[str, Any] = {
        "deployment": "-".join(str(v) for v in dep["key"]), "chip": dep["key"][0],
        "key": list(dep["key"]),
        "date": dep["date"],
        "concurrencies": [p.concurrency for p in off],
        "held_out": np.median(np.array(held), axis=0).tolist(),
        "spread": float(np.median(dep["spread"])) if dep["spread"] else None,
        "front_latency_s": full.front_latency_s,
        "efficiency": full.roofline.efficiency.model_dump(),
    }  # fmt: skip
    on: list[Point] = dep["on"]
    if len(on) >= 2:
        chip, engine, dpa = dep["key"][0], dep["key"][1], dep["key"][7]
        k = num_spec_tokens(engine, chip, dpa)
        try:
            acceptance = infer_acceptance(full, on[0], "mtp", k)
        except PointsError as exc:
            row["mtp"] = {"date": dep["mtp_date"], "k": k, "refused": exc.lines[0]}
            return row
        al = acceptance.acceptance_length
        errors = _errors(on[1:], full, k, al)
        speedups = []
        measured_off = {p.concurrency: p for p in off}
        for p in on[1:]:  # not on[0]: its TPOT is the one the AL was solved for
            if p.concurrency in measured_off:
                q = measured_off[p.concurrency]
                f_off = schedule(q.load()).figures(full.roofline, full.front_latency_s, q.gpus)
                f_on = schedule(p.load(k, al)).figures(
                    replace(full.roofline, method="mtp"), full.front_latency_s, p.gpus)  # fmt: skip
                predicted = f_off.median_tpot_s / f_on.median_tpot_s
                measured = q.tpot_s / p.tpot_s
                speedups.append((p.concurrency, predicted, measured))
        row["mtp"] = {
            "date": dep["mtp_date"], "k": k, "al": al, "al_range": [acceptance.low, acceptance.high],
            "from_concurrency": on[0].concurrency,
            "error": np.median(errors, axis=0).tolist(),
            "speedups": speedups,
        }  # fmt: skip
    return row


def _defaults(fit: Fit) -> dict[str, Any]:
    return {**fit.roofline.efficiency.model_dump(), "front_latency_s": fit.front_latency_s}


def own_defaults(deps: Sequence[dict[str, Any]], chip: str) -> dict[str, Any]:
    """The chip's own defaults, what its catalog entry ships: one fit, from the global
    defaults (never from its answer), on the MTP-off points of every deployment of the chip,
    with how many points and deployments it took."""
    mine = [d for d in deps if d["key"][0] == chip]
    points = [p for d in mine for p in d["off"]]
    own = fit_pooled(points, [roofline(p, False) for p in points], starts=1)
    concurrencies = [p.concurrency for p in points]
    return {**_defaults(own), "points": len(points), "deployments": len(mine),
            "concurrency": [min(concurrencies), max(concurrencies)]}  # fmt: skip


def leave_chip_out(deps: Sequence[dict[str, Any]], chip: str) -> tuple[Fit, list[list[float]]]:
    """The fit on every other chip's points, and each of the chip's deployments' median error
    (TPOT, TTFT, throughput per GPU) at it."""
    others = [p for d in deps if d["key"][0] != chip for p in d["off"]]
    mine = [d for d in deps if d["key"][0] == chip]
    pooled = fit_pooled(others, [roofline(p, False) for p in others], starts=1)
    errors = []
    for dep in mine:
        fits = _with_roofs(pooled, dep["off"])
        errors.append(np.median(np.vstack([_errors([p], f) for p, f in zip(dep["off"], fits,
                                                                              strict=True)]),
                                axis=0).tolist())  # fmt: skip
    return pooled, errors


def uncalibrated(deps: Sequence[dict[str, Any]], chip: str) -> dict[str, Any]:
    """The chip's points at defaults fitted on every other chip's points (leave one chip out:
    ``loco``, where its held-out fits start), and the chip's own defaults."""
    pooled, errors = leave_chip_out(deps, chip)
    return {"chip": chip, "deployments": len(errors), "errors": errors,
            "loco": _defaults(pooled), "defaults": own_defaults(deps, chip)}  # fmt: skip


#: The trust table's figures are rounded to a tenth of a percentage point, as printed here.
TRUST_DIGITS = 3
TRUST_ERROR = ("|predicted / measured - 1| of median TPOT, median TTFT and throughput per GPU: "
               "each deployment's median over its points, then the median over deployments")  # fmt: skip


def _rates(values: Sequence[float]) -> dict[str, float]:
    return {name: round(float(v), TRUST_DIGITS)
            for name, v in zip(("tpot", "ttft", "throughput"), values, strict=True)}  # fmt: skip


def chip_trust(deps: Sequence[dict[str, Any]], chip: str, loco_errors: Sequence[Sequence[float]],
               rows: Sequence[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The chip's entry in the trust table (``speclens.sim.trust``): its deployments and
    MTP-off points, its median leave-one-chip-out error (``loco_errors``, each deployment's),
    its held-out and MTP errors (its deployments' ``score`` rows)."""
    mine = [r for r in rows if r["chip"] == chip]
    entry: dict[str, Any] = {
        "deployments": len(mine),
        "points": sum(len(d["off"]) for d in deps if d["key"][0] == chip),
        "uncalibrated": _rates(np.median(np.array(loco_errors), axis=0)),
        "held_out": _rates(np.median(np.array([r["held_out"] for r in mine]), axis=0)),
    }  # fmt: skip
    mtp = [r["mtp"]["error"] for r in mine if "error" in r.get("mtp", {})]
    if mtp:
        entry["speculating"] = _rates(np.median(np.array(mtp), axis=0))
        entry["speculating_deployments"] = len(mtp)
    return entry


def trust_table(deps: Sequence[dict[str, Any]], figures: dict[str, float],
                chip_rows: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]
                ) -> dict[str, Any]:  # fmt: skip
    """The package's accuracy table (``registry/catalog/accuracy/inferencex.yaml``, read by
    ``speclens.sim.trust``): the medians over every deployment, and each chip's."""
    f = {k: round(v, TRUST_DIGITS) for k, v in figures.items()}
    speculating = sum(1 for r in rows if "error" in r.get("mtp", {}))
    return {
        "kind": "Accuracy",
        "source": "benchmarks/inferencex.py --write-trust, on InferenceX's published "
                  "single-node DeepSeek-R1 runs",
        "error": TRUST_ERROR,
        "held_out": {"deployments": len(rows), "tpot": f["held_out_tpot"],
                     "ttft": f["held_out_ttft"], "throughput": f["held_out_throughput"]},
        "speculating": {"deployments": speculating, "tpot": f["mtp_tpot"],
                        "ttft": f["mtp_ttft"], "throughput": f["mtp_throughput"],
                        "speedup": f["speedup"]},
        "uncalibrated": {"deployments": sum(len(c["errors"]) for c in chip_rows),
                         "tpot": f["uncalibrated_tpot"], "ttft": f["uncalibrated_ttft"],
                         "throughput": f["uncalibrated_throughput"]},
        "chips": {c["chip"]: chip_trust(deps, c["chip"], c["errors"], rows) for c in chip_rows},
        "inferred_acceptance": inferred_acceptance(rows),
    }  # fmt: skip


def inferred_acceptance(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The AL each MTP deployment's lowest-concurrency TPOT implies (``score``'s), one entry a
    deployment: what ``calibrate --acceptance-from`` compares a run's inferred AL against (the
    same model and method elsewhere: ``speclens.sim.trust.inferred_elsewhere``)."""
    out = []
    for r in rows:
        mtp = r.get("mtp") or {}
        if "al" not in mtp:
            continue
        chip, engine, precision, isl, osl, tp, ep, dpa = r["key"]
        out.append({
            "model": "deepseek-r1", "method": "mtp", "chip": chip, "engine": engine,
            "precision": precision, "input_tokens": isl, "output_tokens": osl,
            "tensor_parallel": tp, "expert_parallel": ep, "dp_attention": dpa,
            "num_spec_tokens": mtp["k"], "acceptance_length": round(float(mtp["al"]), 3),
            "range": [round(float(x), 3) for x in mtp["al_range"]],
            "concurrency": mtp["from_concurrency"], "date": mtp["date"],
        })  # fmt: skip
    return out


def write_trust(path: Path, table: dict[str, Any]) -> None:
    """The table as YAML, headed by how it was made."""
    import yaml

    head = ("# Written by `python benchmarks/inferencex.py --write-trust PATH`: regenerate it, "
            "never edit it.\n")  # fmt: skip
    path.write_text(head + yaml.safe_dump(table, sort_keys=False), encoding="utf-8")


def task(call: tuple[str, Any]) -> dict[str, Any]:
    """One fanned-out call: ``("chip", (deployments, chip))`` or ``("score", (deployment,
    its chip's leave-one-chip-out defaults))``."""
    kind, argument = call
    return score(*argument) if kind == "score" else uncalibrated(*argument)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ray", nargs="?", const=fanout.LOCAL, default=None, metavar="ADDRESS",
                        help="run the calls as Ray tasks: alone on a local Ray of --jobs CPUs, "
                        "or on the cluster at ADDRESS (HOST:PORT)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--write-trust", type=Path, default=None, metavar="PATH",
                        help="write the accuracy table speclens states beside its predictions "
                        "(src/speclens/registry/catalog/accuracy/inferencex.yaml)")  # fmt: skip
    parser.add_argument("--section", choices=("all", "single", "disagg"), default="all",
                        help="the single-node runs, the disaggregated ones "
                        "(benchmarks/inferencex_disagg.py), or both")  # fmt: skip
    args = parser.parse_args()
    if args.write_trust and args.section != "all":
        parser.error("--write-trust: the table holds both sections: leave --section out")
    if args.ray is not None:
        problem = fanout.address_problem(args.ray)
        if problem:
            parser.error(f"--ray: {problem}")
        try:
            fanout.require_ray()
        except fanout.FanoutError as exc:
            parser.error(f"--ray: {exc}")
    disagg = None
    if args.section != "single":
        disagg = _disaggregated(args)
        if args.section == "disagg":
            if args.json:
                args.json.write_text(json.dumps({"disaggregated": disagg}, indent=1,
                                                default=float))  # fmt: skip
            return
        print()
    start = time.perf_counter()
    deps = deployments(args.data)
    known = set(catalog.names("chips"))
    skipped = sorted({d["key"][0] for d in deps} - known)
    if skipped:
        print(f"skipped (not in the catalog): {', '.join(skipped)}")
    deps = [d for d in deps if d["key"][0] in known]
    chips = sorted({d["key"][0] for d in deps})
    try:
        chip_rows = fanout.run(task, [("chip", (deps, c)) for c in chips], args.jobs,
                               ray_address=args.ray)  # fmt: skip
        loco = {c["chip"]: c["loco"] for c in chip_rows}
        rows = fanout.run(task, [("score", (d, loco[d["key"][0]])) for d in deps], args.jobs,
                          ray_address=args.ray)  # fmt: skip
    except fanout.FanoutError as exc:
        raise SystemExit(f"--ray: {exc}") from None
    took = time.perf_counter() - start
    where = f"{args.jobs} process(es)" if args.ray is None else f"Ray ({args.ray})"
    print(f"{len(deps)} deployments, {sum(len(d['off']) for d in deps)} MTP-off points, "
          f"{sum(1 for r in rows if 'mtp' in r)} with an MTP run; {took:.0f} s on {where}, "
          f"{platform.processor() or platform.machine()}")  # fmt: skip
    print()
    print(
        "| deployment | date | conc | held-out TPOT | TTFT | tput/GPU | MTP AL (range) | "
        "MTP TPOT | speedup pred / meas | spread |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        h = r["held_out"]
        mtp = r.get("mtp") or {}
        al = (f"{mtp['al']:.2f} ({mtp['al_range'][0]:.2f}-{mtp['al_range'][1]:.2f}) at K "
              f"{mtp['k']}" if "al" in mtp else mtp.get("refused", "-")[:40] if mtp else "-")  # fmt: skip
        err = f"{mtp['error'][0]:.1%}" if "error" in mtp else "-"
        sp = "; ".join(f"c{c} {a:.2f}/{b:.2f}" for c, a, b in mtp.get("speedups", [])) or "-"
        spread = f"{r['spread']:.0%}" if r["spread"] is not None else "-"
        print(f"| {r['deployment']} | {r['date']} | {','.join(map(str, r['concurrencies']))} | "
              f"{h[0]:.1%} | {h[1]:.1%} | {h[2]:.1%} | {al} | {err} | {sp} | {spread} |")  # fmt: skip
    print()
    held = np.array([r["held_out"] for r in rows])
    mtp_rows = [r["mtp"] for r in rows if "error" in r.get("mtp", {})]
    speed = [abs(a - b) for r in mtp_rows for _, a, b in r["speedups"]]
    unc = np.array([e for c in chip_rows for e in c["errors"]])
    figures = {
        "held_out_tpot": float(np.median(held[:, 0])),
        "held_out_ttft": float(np.median(held[:, 1])),
        "held_out_throughput": float(np.median(held[:, 2])),
        "mtp_tpot": _median([r["error"][0] for r in mtp_rows]),
        "mtp_ttft": _median([r["error"][1] for r in mtp_rows]),
        "mtp_throughput": _median([r["error"][2] for r in mtp_rows]),
        "speedup": _median(speed),
        "uncalibrated_tpot": float(np.median(unc[:, 0])),
        "uncalibrated_ttft": float(np.median(unc[:, 1])),
        "uncalibrated_throughput": float(np.median(unc[:, 2])),
        "spread_between_dates": _median([r["spread"] for r in rows if r["spread"] is not None]),
    }  # fmt: skip
    print("| figure (median over deployments) | value | goal | met |")
    print("|---|---|---|---|")
    for name, value in figures.items():
        goal = GOALS.get(name)
        met = "-" if goal is None else ("yes" if value <= goal else "no")
        unit = " (abs. difference)" if name == "speedup" else ""
        print(f"| {name}{unit} | {value:.1%} | {'-' if goal is None else f'<= {goal:.0%}'} | "
              f"{met} |")  # fmt: skip
    print()
    print(f"speedup: {len(speed)} comparisons, each at a concurrency the AL was not inferred at")
    print()
    print("| chip | deployments | uncalibrated TPOT / TTFT / tput (LOCO) | own defaults |")
    print("|---|---|---|---|")
    for c in chip_rows:
        e = np.median(np.array(c["errors"]), axis=0)
        d = c["defaults"]
        print(f"| {c['chip']} | {c['deployments']} | {e[0]:.1%} / {e[1]:.1%} / {e[2]:.1%} | "
              f"compute {d['compute']:.3g}, memory {d['memory']:.3g}, overhead "
              f"{d['overhead'] * 1e3:.2f} ms, per token {d['per_token'] * 1e6:.1f} us, "
              f"front {d['front_latency_s'] * 1e3:.0f} ms |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "deployments": rows,
                                         "chips": chip_rows, "disaggregated": disagg},
                                        indent=1, default=float))  # fmt: skip
    if args.write_trust and disagg is not None:
        table = trust_table(deps, figures, chip_rows, rows)
        table["disaggregated"] = _disagg_module().trust_block(disagg)
        write_trust(args.write_trust, table)


def _disagg_module() -> Any:
    """``benchmarks/inferencex_disagg.py``, importable by name (fanned-out calls pickle its
    ``task``: spawned processes inherit this ``sys.path``)."""
    import sys

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import inferencex_disagg

    return inferencex_disagg


def _disaggregated(args: argparse.Namespace) -> dict[str, Any]:
    """The disaggregated section: run, printed, returned."""
    module = _disagg_module()
    start = time.perf_counter()

    def fan(task: Any, calls: list[Any]) -> list[Any]:
        try:
            return fanout.run(task, calls, args.jobs, ray_address=args.ray)
        except fanout.FanoutError as exc:
            raise SystemExit(f"--ray: {exc}") from None

    result: dict[str, Any] = module.run(args.data, fan)
    where = f"{args.jobs} process(es)" if args.ray is None else f"Ray ({args.ray})"
    print(f"disaggregated: {time.perf_counter() - start:.0f} s on {where}, "
          f"{platform.processor() or platform.machine()}")  # fmt: skip
    module.report(result)
    return result


if __name__ == "__main__":
    main()
