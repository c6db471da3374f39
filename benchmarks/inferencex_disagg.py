"""speclens's predictions against InferenceX's published disaggregated DeepSeek-R1 runs.

    python benchmarks/inferencex.py --section disagg [--jobs 2] [--json OUT]

InferenceX's 670 disaggregated runs (prefill and decode workers on separate nodes: NVIDIA
Dynamo with SGLang or TensorRT-LLM, AMD Mori with SGLang; ``disagg: true``) are read as
``speclens import inferencex`` writes them (each point's prefill and decode pools, GPUs both
pools') and priced by ``speclens.sim.disagg`` at each point's own layout. A configuration is
one chip, engine, precision and lengths; its layouts, worker counts, concurrencies and dates
vary. A point repeated on several dates (same layout and concurrency) is scored once, at its
latest date; the spread between its dates is the data's own noise, printed beside the errors.

- held out: per configuration, the roofline fitted on its other MTP-off points predicts the
  one left out (leave one point out; at most ``FOLDS`` folds, each leaving out every
  ``FOLDS``-th point), starting from the chip's leave-one-chip-out defaults;
- MTP on: the fit on every MTP-off point, the AL inferred from the lowest-concurrency MTP point
  at its K (``num_spec_tokens``: InferenceX states none), then every other MTP point predicted
  at that AL (carried by the AL curve to a point of another K);
- uncalibrated: each chip's points at one fit on every other chip's disaggregated MTP-off
  points (leave one chip out: never scored on points it was fitted on);
- own defaults: the chips without single-node runs (h100, gb200, gb300) ship defaults fitted
  on all their disaggregated MTP-off points (``own_defaults``; ``tests/sim`` reruns it).

Errors are |predicted / measured - 1| of median TPOT, median TTFT and total throughput per GPU;
each figure is the median over configurations (each configuration's own median over its points).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speclens.sim import catalog, fit_points
from speclens.sim.fit_points import Fit, Point, PointsError, fit_pooled, infer_acceptance
from speclens.sim.roofline import Efficiency, Roofline

FILES = ("benchmarks.json", "benchmarks-history.json")
#: A configuration: what one fit prices (its layouts vary).
CONFIGURATION = ("hardware", "framework", "precision", "isl", "osl")
#: A point's layout: its pools.
LAYOUT = ("prefill_tp", "prefill_ep", "prefill_dp_attention", "prefill_num_workers",
          "num_prefill_gpu", "decode_tp", "decode_ep", "decode_dp_attention",
          "decode_num_workers", "num_decode_gpu")  # fmt: skip
#: The engine family of each disaggregated framework: K follows its single-node scripts.
FAMILY = {"dynamo-trt": "trt", "dynamo-sglang": "sglang", "mori-sglang": "sglang"}


def num_spec_tokens(point: Point) -> int:
    """K of a disaggregated MTP point (InferenceX states none): as its engine family's
    single-node scripts set it (its data README's table): TensorRT-LLM 3, or 1 with attention
    data parallelism on the decode pool; SGLang 2 on h200, b200 and b300 (EAGLE steps), else 3."""
    s = point.settings
    family = FAMILY.get(str(s["engine"]), str(s["engine"]))
    if family == "trt":
        return 1 if s["decode"]["dp_attention"] else 3
    if family == "sglang" and s["hardware"] in ("h100", "h200", "b200", "b300"):
        return 2
    return 3


#: The most leave-one-out folds a configuration's held-out score runs.
FOLDS = 6
GOALS = {"held_out_tpot": 0.12, "held_out_throughput": 0.15, "held_out_ttft": 0.30,
         "mtp_tpot": 0.20, "uncalibrated_tpot": 0.25}  # fmt: skip
#: The chips whose catalog defaults are fitted on their disaggregated points (no single-node
#: runs of theirs fitted any).
DISAGG_DEFAULTS = ("gb200", "gb300", "h100")


def point(p: dict[str, Any]) -> Point:
    """A published disaggregated point as ``speclens import inferencex`` writes its settings."""
    m = p["metrics"]
    pools = {
        name: {"tensor_parallel": p[f"{name}_tp"], "expert_parallel": p[f"{name}_ep"],
               "dp_attention": p[f"{name}_dp_attention"], "workers": p[f"{name}_num_workers"],
               "gpus": p[f"num_{name}_gpu"]}
        for name in ("prefill", "decode")
    }  # fmt: skip
    settings = {
        "model": "deepseek-r1", "hardware": p["hardware"], "engine": p["framework"],
        "precision": p["precision"], "tensor_parallel": p["decode_tp"],
        "expert_parallel": p["decode_ep"], "dp_attention": p["decode_dp_attention"],
        "gpus": p["num_prefill_gpu"] + p["num_decode_gpu"], "disaggregated": True,
        "input_tokens": {"min": p["isl"], "max": p["isl"]},
        "output_tokens": {"min": p["osl"], "max": p["osl"]}, "concurrency": p["conc"],
        "method": None if p["spec_method"] == "none" else p["spec_method"], "date": p["date"],
        **pools,
    }  # fmt: skip
    return Point(Path(f"{p['run_url']}#c{p['conc']}"), settings, m["median_tpot"],
                 m["median_ttft"], m["tput_per_gpu"])  # fmt: skip


def configurations(data: Path) -> tuple[list[dict[str, Any]], int]:
    """Each configuration's MTP-off and MTP points (one a layout and concurrency: the latest
    date's; ``every_off``, ``every_on``: every date's) and the spread between dates of its
    repeated MTP-off points; and how many points state no workers (InferenceX's earliest runs:
    their layout cannot be read)."""
    raw: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for name in FILES:
        for p in json.loads((data / name).read_text()):
            key = (p["run_url"], p["conc"], p["spec_method"], *(p[k] for k in CONFIGURATION))
            if p["disagg"] and key not in seen:
                seen.add(key)
                raw.append(p)
    unreadable = sum(1 for p in raw if not (p["prefill_num_workers"] and p["decode_num_workers"]))
    raw = [p for p in raw if p["prefill_num_workers"] and p["decode_num_workers"]]
    groups: dict[tuple[Any, ...], dict[str, dict[tuple[Any, ...], list[dict[str, Any]]]]] = (
        defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    )
    for p in raw:
        where = (*(p[k] for k in LAYOUT), p["conc"])
        groups[tuple(p[k] for k in CONFIGURATION)][p["spec_method"]][where].append(p)
    out = []
    for key, by in sorted(groups.items()):
        spread = [max(q["metrics"]["median_tpot"] for q in ps)
                  / min(q["metrics"]["median_tpot"] for q in ps) - 1
                  for ps in by.get("none", {}).values() if len(ps) > 1]  # fmt: skip
        out.append({"key": key, "off": _latest(by.get("none", {})),
                    "on": _latest(by.get("mtp", {})), "spread": spread,
                    "every_off": _every(by.get("none", {})),
                    "every_on": _every(by.get("mtp", {}))})  # fmt: skip
    return out, unreadable


def _every(points: dict[tuple[Any, ...], list[dict[str, Any]]]) -> list[Point]:
    """Every date's point, by concurrency (then date)."""
    chosen = [point(p) for ps in points.values() for p in ps]
    return sorted(chosen, key=lambda q: (q.concurrency, str(q.settings["date"])))


def _latest(points: dict[tuple[Any, ...], list[dict[str, Any]]]) -> list[Point]:
    """One point a layout and concurrency, its latest date's, by concurrency."""
    chosen = [point(max(ps, key=lambda p: p["date"])) for ps in points.values()]
    return sorted(chosen, key=lambda q: (q.concurrency, str(q.settings["decode"])))


def roofline(p: Point, efficiency: Efficiency | None = None) -> Roofline:
    """DeepSeek-R1 at the point's precision on its chip; at ``efficiency`` (else the chip's
    defaults), priced at the point's own pools by ``fit_points.deployed``."""
    s = p.settings
    model = catalog.with_precision(catalog.model("deepseek-r1"), s["precision"])
    return Roofline(model, catalog.chip(s["hardware"]), efficiency=efficiency)


def _priced(points: Sequence[Point], efficiency: Efficiency | None = None) -> list[Any]:
    return [fit_points.deployed(roofline(p, efficiency), p) for p in points]


def errors(points: Sequence[Point], efficiency: Efficiency, front: float, k: int = 0,
           al: float = 1.0) -> np.ndarray:  # fmt: skip
    """Per point, |predicted / measured - 1| of TPOT, TTFT, throughput per GPU, each point
    priced at its own pools at ``efficiency``."""
    rows = []
    for p, priced in zip(points, _priced(points, efficiency), strict=True):
        if k:
            priced = fit_points.with_method(priced, "mtp")
        f = fit_points.predict(p, priced, front, k, al)
        rows.append([f.median_tpot_s / p.tpot_s - 1, f.median_ttft_s / p.ttft_s - 1,
                     f.throughput_per_gpu / p.throughput_per_gpu - 1])  # fmt: skip
    return np.abs(np.array(rows)).reshape(-1, 3)


def _efficiency(fit: Fit) -> Efficiency:
    return fit.roofline.efficiency


def fit(points: Sequence[Point], start: Efficiency | None = None, front: float = 0.05,
        starts: int = 3) -> Fit:  # fmt: skip
    return fit_pooled(points, _priced(points, start), front, starts=starts)


def score(config: dict[str, Any], start: dict[str, Any]) -> dict[str, Any]:
    """A configuration's held-out and MTP figures (see the module); the held-out fits start
    from ``start`` (the chip's leave-one-chip-out defaults and front latency)."""
    off: list[Point] = config["off"]
    unseen = Efficiency(**{k: v for k, v in start.items() if k in Efficiency.model_fields})
    front = start["front_latency_s"]
    held = []
    folds = min(FOLDS, len(off))
    for f in range(folds):
        test, train = off[f::folds], [p for i, p in enumerate(off) if i % folds != f]
        trained = fit(train, unseen, front, 1)
        held.append(errors(test, _efficiency(trained), trained.front_latency_s))
    full = fit(off, unseen, front)
    row: dict[str, Any] = {
        "configuration": "-".join(str(v) for v in config["key"]), "chip": config["key"][0],
        "key": list(config["key"]), "points": len(off),
        "layouts": len({str((p.settings["prefill"], p.settings["decode"])) for p in off}),
        "held_out": np.median(np.vstack(held), axis=0).tolist(),
        "own": np.median(np.abs(np.expm1(full.residuals)), axis=0).tolist(),
        "spread": float(np.median(config["spread"])) if config["spread"] else None,
        "efficiency": _efficiency(full).model_dump(), "front_latency_s": full.front_latency_s,
    }  # fmt: skip
    on: list[Point] = config["on"]
    if len(on) >= 2:
        k = num_spec_tokens(on[0])
        try:
            found = infer_acceptance(full, on[0], "mtp", k)
        except PointsError as exc:
            row["mtp"] = {"k": k, "refused": exc.lines[0]}
            return row
        e = np.vstack([errors([p], _efficiency(full), full.front_latency_s, num_spec_tokens(p),
                              _al_at(found, num_spec_tokens(p))) for p in on[1:]])  # fmt: skip
        row["mtp"] = {"k": k, "al": found.acceptance_length, "al_range": [found.low, found.high],
                      "from_concurrency": on[0].concurrency, "points": len(on) - 1,
                      "error": np.median(e, axis=0).tolist()}  # fmt: skip
    return row


def _al_at(found: Any, k: int) -> float:
    """The inferred AL carried to K ``k`` by the shipped AL curve (a layout whose engine ran
    another K: TensorRT-LLM runs K 1 with attention data parallelism)."""
    if k == found.num_spec_tokens:
        return float(found.acceptance_length)
    from speclens.acceptance import curve

    al = float(found.acceptance_length)
    mapped = curve.shipped().predict(al, found.num_spec_tokens, al, al, "inferred")
    return min(float(mapped[k - 1].acceptance_length), k + 1.0)


def _defaults(f: Fit) -> dict[str, Any]:
    return {**_efficiency(f).model_dump(), "front_latency_s": f.front_latency_s}


def own_defaults(configs: Sequence[dict[str, Any]], chip: str) -> dict[str, Any]:
    """The chip's own defaults (``DISAGG_DEFAULTS``): one fit, from the global defaults, on the
    MTP-off points of every disaggregated configuration of the chip, with how many points,
    configurations and the concurrencies they span."""
    mine = [c for c in configs if c["key"][0] == chip]
    points = [p for c in mine for p in c["off"]]
    own = fit(points, Efficiency(), starts=1)
    concurrencies = [p.concurrency for p in points]
    return {**_defaults(own), "points": len(points), "configurations": len(mine),
            "concurrency": [min(concurrencies), max(concurrencies)]}  # fmt: skip


def leave_chip_out(configs: Sequence[dict[str, Any]], chip: str) -> dict[str, Any]:
    """One fit on every other chip's disaggregated MTP-off points, and each of the chip's
    configurations' median error at it."""
    others = [p for c in configs if c["key"][0] != chip for p in c["off"]]
    pooled = fit(others, Efficiency(), starts=1)
    mine = [c for c in configs if c["key"][0] == chip]
    errs = [np.median(errors(c["off"], _efficiency(pooled), pooled.front_latency_s),
                      axis=0).tolist() for c in mine]  # fmt: skip
    return {"chip": chip, "configurations": len(mine), "errors": errs, "loco": _defaults(pooled)}


def task(call: tuple[str, Any]) -> dict[str, Any]:
    """One fanned-out call: ``("chip", (configs, chip))``, ``("own", (configs, chip))`` or
    ``("score", (config, start))``."""
    kind, argument = call
    if kind == "score":
        return score(*argument)
    if kind == "own":
        return {"chip": argument[1], **own_defaults(*argument)}
    return leave_chip_out(*argument)


def scored(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configurations a held-out score can take: at least 3 MTP-off points."""
    return [c for c in configs if len(c["off"]) >= 3]


def run(data: Path, fan: Any) -> dict[str, Any]:
    """Every figure of the section: ``fan(task, calls)`` runs the calls (in processes or Ray)."""
    configs, unreadable = configurations(data)
    configs = [c for c in configs if c["key"][0] in catalog.names("chips")]
    chips = sorted({c["key"][0] for c in configs})
    with_points = [c for c in configs if c["off"]]
    chip_rows = fan(task, [("chip", (with_points, c)) for c in chips])
    own = fan(task, [("own", (with_points, c)) for c in DISAGG_DEFAULTS if c in chips])
    loco = {c["chip"]: c["loco"] for c in chip_rows}
    rows = fan(task, [("score", (c, loco[c["key"][0]])) for c in scored(configs)])
    held = np.array([r["held_out"] for r in rows])
    mtp = [r["mtp"]["error"] for r in rows if "error" in r.get("mtp", {})]
    unc = np.array([e for c in chip_rows for e in c["errors"]])
    spread = [r["spread"] for r in rows if r["spread"] is not None]
    figures = {
        "held_out_tpot": float(np.median(held[:, 0])),
        "held_out_ttft": float(np.median(held[:, 1])),
        "held_out_throughput": float(np.median(held[:, 2])),
        "mtp_tpot": float(np.median([e[0] for e in mtp])) if mtp else float("nan"),
        "uncalibrated_tpot": float(np.median(unc[:, 0])),
        "uncalibrated_ttft": float(np.median(unc[:, 1])),
        "uncalibrated_throughput": float(np.median(unc[:, 2])),
        "spread_between_dates": float(np.median(spread)) if spread else float("nan"),
    }  # fmt: skip
    return {"figures": figures, "configurations": rows, "chips": chip_rows, "own": own,
            "unreadable": unreadable,
            "points": sum(len(c["off"]) + len(c["on"]) for c in configs)}  # fmt: skip


def report(result: dict[str, Any]) -> None:
    """The section's tables, as benchmarks/README.md keeps them."""
    rows, figures = result["configurations"], result["figures"]
    print(f"{result['points']} distinct disaggregated points ({result['unreadable']} state no "
          f"workers and are left out), {len(rows)} configurations scored")  # fmt: skip
    print()
    print("| configuration | points (layouts) | held-out TPOT | TTFT | tput/GPU | MTP AL at K "
          "(range) | MTP TPOT | spread |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        h, m = r["held_out"], r.get("mtp") or {}
        al = (f"{m['al']:.2f} at K {m['k']} ({m['al_range'][0]:.2f}-{m['al_range'][1]:.2f}) "
              f"from c{m['from_concurrency']}" if "al" in m else m.get("refused", "-")[:40] if m
              else "-")  # fmt: skip
        err = f"{m['error'][0]:.1%} ({m['points']})" if "error" in m else "-"
        spread = f"{r['spread']:.0%}" if r["spread"] is not None else "-"
        print(f"| {r['configuration']} | {r['points']} ({r['layouts']}) | {h[0]:.1%} | "
              f"{h[1]:.1%} | {h[2]:.1%} | {al} | {err} | {spread} |")  # fmt: skip
    print()
    print("| figure (median over configurations) | value | goal | met |")
    print("|---|---|---|---|")
    for name, value in figures.items():
        goal = GOALS.get(name)
        met = "-" if goal is None else ("yes" if value <= goal else "no")
        print(f"| {name} | {value:.1%} | {'-' if goal is None else f'<= {goal:.0%}'} | {met} |")
    print()
    print("| chip | configurations | uncalibrated TPOT / TTFT / tput (LOCO) |")
    print("|---|---|---|")
    for c in result["chips"]:
        e = np.median(np.array(c["errors"]), axis=0)
        print(f"| {c['chip']} | {c['configurations']} | {e[0]:.1%} / {e[1]:.1%} / {e[2]:.1%} |")
    for d in result["own"]:
        print(f"own defaults {d['chip']} ({d['points']} points, {d['configurations']} "
              f"configurations, concurrency {d['concurrency'][0]}..{d['concurrency'][1]}): "
              f"compute {d['compute']:.3g}, memory {d['memory']:.3g}, overhead "
              f"{d['overhead']:.3g} s, per token {d['per_token']:.3g} s, prefill compute "
              f"{d['prefill_compute']:.3g}, front {d['front_latency_s']:.3g} s")  # fmt: skip


def _rates(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    return {name: round(float(v), digits)
            for name, v in zip(("tpot", "ttft", "throughput"), values, strict=True)}  # fmt: skip


def trust_block(result: dict[str, Any]) -> dict[str, Any]:
    """The accuracy table's ``disaggregated`` block (``speclens.sim.trust.Disaggregated``): the
    medians over configurations, and each chip's (its leave-one-chip-out error and, where it
    has scored configurations, their held-out error)."""
    rows, f = result["configurations"], result["figures"]
    mtp = [r["mtp"]["error"] for r in rows if "error" in r.get("mtp", {})]
    chips = {}
    for c in result["chips"]:
        mine = [r for r in rows if r["chip"] == c["chip"]]
        if not mine or not c["errors"]:
            continue
        chips[c["chip"]] = {
            "deployments": c["configurations"], "points": sum(r["points"] for r in mine),
            "uncalibrated": _rates(np.median(np.array(c["errors"]), axis=0)),
            "held_out": _rates(np.median(np.array([r["held_out"] for r in mine]), axis=0)),
        }  # fmt: skip
        chip_mtp = [r["mtp"]["error"] for r in mine if "error" in r.get("mtp", {})]
        if chip_mtp:
            chips[c["chip"]]["speculating"] = _rates(np.median(np.array(chip_mtp), axis=0))
            chips[c["chip"]]["speculating_deployments"] = len(chip_mtp)
    block: dict[str, Any] = {
        "held_out": {"deployments": len(rows), **_rates([f["held_out_tpot"], f["held_out_ttft"],
                                                        f["held_out_throughput"]])},
        "uncalibrated": {"deployments": sum(len(c["errors"]) for c in result["chips"]),
                         **_rates([f["uncalibrated_tpot"], f["uncalibrated_ttft"],
                                   f["uncalibrated_throughput"]])},
        "chips": chips,
    }  # fmt: skip
    if mtp:
        block["speculating"] = {"deployments": len(mtp),
                                **_rates(np.median(np.array(mtp), axis=0))}  # fmt: skip
    return block
