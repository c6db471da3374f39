"""Judge a run against the acceptance it was supposed to hit.

Under forced acceptance at AL X, every verify step accepts floor(X - 1) or ceil(X - 1) drafts
(the minimum-variance schedule), the latter with probability frac(X - 1). The verdict checks the
realized token-weighted AL against X within ``z`` standard errors of that schedule, that no step
fell outside those two counts, and that the split lies within ``z`` standard errors of frac.

A PASS needs evidence: fewer than ``MIN_VERIFY_STEPS`` steps is "inconclusive" (never PASS), as
the z band is a normal approximation to a binomial count, and a handful of steps that happen to
match say little. Every reason names the verify steps it rests on, and a run's categories whose
AL rests on fewer steps are warned about (``thin_categories``).
"""

from __future__ import annotations

import math
from typing import Any

from speclens.acceptance import (
    acceptance_length,
    accepted_count_distribution,
    minimum_variance_rates,
)

DEFAULT_Z = 4.0
MIN_VERIFY_STEPS = 30  # the usual floor for a normal approximation to a binomial proportion


def verify(
    histogram: dict[str, int], expected_length: float, k: int, z: float = DEFAULT_Z
) -> dict[str, Any]:
    """The verdict and the numbers behind it (``passed`` is the bottom line)."""
    counts = {int(j): n for j, n in histogram.items() if n}
    steps = sum(counts.values())
    expected = accepted_count_distribution(minimum_variance_rates(expected_length, k))
    out: dict[str, Any] = {
        "expected_acceptance_length": expected_length,
        "num_spec_tokens": k,
        "z": z,
        "verify_steps": steps,
        "expected_distribution": {str(j): p for j, p in expected.items()},
    }
    if steps < MIN_VERIFY_STEPS:
        return {
            **out,
            "passed": False,
            "inconclusive": True,
            "reason": f"inconclusive: {steps} verify steps were reported, at least "
            f"{MIN_VERIFY_STEPS} are needed to judge (send more requests or more tokens)",
        }
    realized = acceptance_length(sum(j * n for j, n in counts.items()), steps)
    high = max(expected)
    p_high = expected[high] if len(expected) == 2 else 0.0
    se = math.sqrt(p_high * (1.0 - p_high) / steps)
    tolerance = z * se + 1e-9
    unexpected = {str(j): n for j, n in sorted(counts.items()) if j not in expected}
    observed_high = counts.get(high, 0) / steps if len(expected) == 2 else None
    al_ok = abs(realized - expected_length) <= tolerance
    split_ok = observed_high is None or abs(observed_high - p_high) <= tolerance
    histogram_ok = not unexpected and split_ok
    reasons = []
    if not al_ok:
        reasons.append(
            f"realized AL {realized:.4f} is outside {expected_length:g} ± {tolerance:.4f} "
            f"({z:g} standard errors of {se:.4f} over {steps} verify steps)"
        )
    if unexpected:
        reasons.append(
            f"steps accepted counts the schedule never draws: {unexpected} "
            f"(expected only {sorted(expected)})"
        )
    if not split_ok:
        reasons.append(
            f"{observed_high:.4f} of steps accepted {high}, expected {p_high:.4f} ± {tolerance:.4f}"
        )
    return {
        **out,
        "realized_acceptance_length": realized,
        "standard_error": se,
        "interval": [expected_length - tolerance, expected_length + tolerance],
        "al_ok": al_ok,
        "histogram_ok": histogram_ok,
        "unexpected_buckets": unexpected,
        "observed_split": observed_high,
        "expected_split": p_high if len(expected) == 2 else None,
        "passed": al_ok and histogram_ok,
        "inconclusive": False,
        "reason": "; ".join(reasons)
        or f"realized AL {realized:.4f} and histogram match the forced schedule over {steps} "
        "verify steps",
    }


def thin_categories(summary: dict[str, Any]) -> list[str]:
    """One warning per category whose AL rests on fewer than ``MIN_VERIFY_STEPS`` verify steps
    (none when only one category was sent: the verdict's own evidence line says it)."""
    rows = summary.get("figures", {}).get("acceptance", {}).get("al_by_category") or {}
    if len(rows) < 2:
        return []
    thin = sorted(
        (c, row["verify_steps"]) for c, row in rows.items()
        if row.get("al") is not None and row.get("verify_steps", 0) < MIN_VERIFY_STEPS
    )  # fmt: skip
    if not thin:
        return []
    shown = ", ".join(f"{c} ({n})" for c, n in thin)
    return [
        f"{len(thin)} of {len(rows)} categories have an AL resting on fewer than "
        f"{MIN_VERIFY_STEPS} verify steps: {shown}; send more requests to read them"
    ]
