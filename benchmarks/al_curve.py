"""AL at any K from one K (``speclens.acceptance.curve``), left out one golden file at a time.

The nine InferenceX golden files (the shipped set ``inferencex-golden-al-2026-08``, their
import) hold 14 curves, AL at K 1..8: a file holds a model's thinking-on and thinking-off
curves, so a file is left out whole (its sibling mode would leak). For each file, the model is
fitted on the other eight (``curve.fit``) and predicts every K of each of its curves from each
single K; the constant per-position acceptance (AL(K) = (1 - a^(K+1)) / (1 - a), the same
solver at d = 1) predicts beside it. Errors are |predicted / measured - 1| over every (K_obs,
K) pair with K != K_obs; the median and P90 are nearest-rank (the smallest error with at least
half, or 90%, of the errors at or below it). The range's coverage is the share of held-out ALs
inside the range predicted for them. Goal: median <= 5%, P90 <= 12%, over every pair.

    python benchmarks/al_curve.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

from speclens.acceptance import curve
from speclens.acceptance.registry import ACCEPTANCE_DIR, load_sets, shipped_registry

GOAL_MEDIAN, GOAL_P90 = 0.05, 0.12


def rank(values: list[float], q: float) -> float:
    """Nearest-rank quantile: the smallest value with at least ``q`` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def held_out(curves: list[curve.TrainingCurve]) -> list[dict[str, Any]]:
    """Each curve's errors (model, baseline), by K_obs, and its range's hits, its file left out."""
    rows = []
    for source in sorted({c.source for c in curves}):
        model = curve.fit([c for c in curves if c.source != source], "the other files")
        for held in (c for c in curves if c.source == source):
            row: dict[str, Any] = {"curve": held.name, "decay": model.decay, "pairs": []}
            for k in curve.CURVE_KS:
                observed = held.lengths[k - 1]
                points = model.predict(observed, k)
                base = curve.constant_rate(observed, k)
                for p in points:
                    if p.num_spec_tokens == k:
                        continue
                    measured = held.lengths[p.num_spec_tokens - 1]
                    row["pairs"].append({
                        "k_obs": k, "k": p.num_spec_tokens,
                        "model": abs(p.acceptance_length / measured - 1),
                        "baseline": abs(base[p.num_spec_tokens - 1] / measured - 1),
                        "covered": p.low <= measured <= p.high,
                        "width": (p.high - p.low) / p.acceptance_length,
                    })  # fmt: skip
            rows.append(row)
    return rows


def figures(pairs: list[dict[str, Any]]) -> dict[str, float]:
    model = [p["model"] for p in pairs]
    base = [p["baseline"] for p in pairs]
    return {
        "median": rank(model, 0.5), "p90": rank(model, 0.9),
        "baseline_median": rank(base, 0.5), "baseline_p90": rank(base, 0.9),
        "coverage": sum(p["covered"] for p in pairs) / len(pairs),
        "width": rank([p["width"] for p in pairs], 0.5), "pairs": len(pairs),
    }  # fmt: skip


def line(name: str, f: dict[str, float], decay: str = "") -> str:
    return (f"| {name} | {decay} | {f['median']:.1%} / {f['p90']:.1%} | "
            f"{f['baseline_median']:.1%} / {f['baseline_p90']:.1%} | {f['coverage']:.0%} | "
            f"{f['width']:.0%} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="Write the figures as JSON here.")
    args = parser.parse_args()
    started = time.perf_counter()
    path = shipped_registry() / ACCEPTANCE_DIR / f"{curve.TRAINING_SET}.yaml"
    (registered,) = load_sets([path])
    curves = curve.training_curves(registered.profile_set, str(path))
    rows = held_out(curves)
    every = [p for r in rows for p in r["pairs"]]
    overall = figures(every)
    from_two = figures([p for p in every if p["k_obs"] == 2])
    print(f"{len(curves)} curves in {len({c.source for c in curves})} files; the model on all "
          f"of them: {curve.shipped().describe()}")  # fmt: skip
    print("| held-out curve | d fitted without its file | model: median / P90 | constant rate: "
          "median / P90 | range coverage | range width (median) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(line(r["curve"], figures(r["pairs"]), f"{r['decay']:.3f}"))
    print(line("**every K from each single K**", overall))
    print(line("from K 2 only", from_two))
    met = overall["median"] <= GOAL_MEDIAN and overall["p90"] <= GOAL_P90
    print(f"goal median <= {GOAL_MEDIAN:.0%}, P90 <= {GOAL_P90:.0%}: "
          f"{'met' if met else 'NOT met'}; baseline beaten: "
          f"{overall['median'] < overall['baseline_median'] and overall['p90'] < overall['baseline_p90']}")  # fmt: skip
    by_step = {}
    for step in range(1, curve.MAX_CURVE_K):
        hits = [p["covered"] for p in every if abs(p["k"] - p["k_obs"]) == step]
        by_step[step] = sum(hits) / len(hits)
    print("range coverage by |K - K_obs|: "
          + ", ".join(f"{s} {c:.0%}" for s, c in by_step.items()))  # fmt: skip
    seconds = time.perf_counter() - started
    print(f"{seconds:.1f} s on {platform.machine()}, Python {platform.python_version()}")
    if args.json:
        args.json.write_text(json.dumps({"overall": overall, "from_k2": from_two,
                                         "coverage_by_step": by_step, "curves": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
