"""The answer to "which choice delivers the most tok/s/GPU at X tok/s/user", in one sentence.

One wording for every command that answers it: ``speclens sim --at-interactivity`` (the Ks of a
simulated grid) and ``speclens compare --at-interactivity`` (runs, sweeps, or the Ks of one
sweep). A choice is named ("K 4", "no speculation", a run's label) and has its figure at the
target interactivity, or none where its curve does not reach it; a figure read from measured
points has a 95% interval, a simulated one none.

    at 40 tok/s/user, K 4 delivers 476 output tok/s/GPU, +37.2% over K 1 (best of K 1..8)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Said after a sentence in which no choice reaches the target because every curve's slowest
#: point is already faster: the batch stopped growing before the target.
TOO_FAST = ("every curve's slowest point is faster (the batch stops growing: raise the "
            "concurrency or max_num_seqs)")  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """One choice at the target: its name, its tok/s/GPU there (None: its curve does not reach
    the target) and that figure's 95% interval (None: no interval)."""

    name: str
    value: float | None
    low: float | None = None
    high: float | None = None
    #: "measured" (its interval a 95% CI), "aggregate-only" (published, no interval) or
    #: "predicted" (its band the prediction's expected error, where known).
    kind: str = "measured"


def k_name(k: int | None) -> str:
    """A K as a sentence names it: "K 4", or "no speculation" for K 0 (or none)."""
    return f"K {k}" if k else "no speculation"


def k_span(ks: Sequence[int | None]) -> str:
    """The Ks a decision chose among, only those that ran: "K 1..8", "no speculation, K 1..4",
    "K 3", "K 2, 4" (K 3 did not run), "K 1..3, 8"."""
    spec = sorted({int(k) for k in ks if k})
    parts = [k_name(0)] if len(spec) < len(ks) else []
    runs: list[list[int]] = []
    for k in spec:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    shown = [f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    if shown:
        parts.append("K " + ", ".join(shown))
    return ", ".join(parts)


def _interval(low: float | None, high: float | None, fmt: str, kind: str = "measured") -> str:
    if low is None or high is None:
        return ""
    if kind == "predicted":
        return f" (predicted, expected range {low:{fmt}} to {high:{fmt}})"
    return f" (95% CI {low:{fmt}} to {high:{fmt}})"


def headline(
    choices: Sequence[Choice],
    target: float,
    span: str,
    *,
    noun: str = "K",
    gain: tuple[float, float | None, float | None] | None = None,
    too_fast: bool = False,
    unit: str = "tok/s/GPU",
    unresolved: str | None = None,
) -> str:
    """The decision in one line: the best choice's figure at ``target`` tok/s/user (with its
    interval where it has one), its gain over the first choice (``gain``: (ratio, low, high)
    of best over first; computed without an interval when not given), ``span`` (what was chosen
    among), and the choices that do not reach the target. ``noun`` names the choices in the line
    said when none reaches it ("no K reaches"); ``too_fast`` adds why (``TOO_FAST``). ``unit``
    names the figure ("total tok/s/GPU"). ``unresolved`` (compare's): why the best's lead is no
    win (fewer than 3 rounds a side, no interval, inside the interval); the line then says
    "highest of" instead of "best of", and when the first choice reads highest it states the
    runner-up against it, so a loss reads as a loss."""
    reached = [c for c in choices if c.value is not None]
    if not reached:
        line = f"at {target:g} tok/s/user, no {noun} reaches that interactivity ({span})"
        return line + (f": {TOO_FAST}" if too_fast else "")
    best = max(reached, key=lambda c: c.value or 0.0)
    assert best.value is not None
    line = (f"at {target:g} tok/s/user, {best.name} delivers {best.value:,.0f} {unit}"
            + _interval(best.low, best.high, ",.0f", best.kind))  # fmt: skip
    first = choices[0]
    if first is not best and first.value:
        ratio, low, high = gain if gain is not None else (best.value / first.value, None, None)
        shown = _interval(None if low is None else low - 1, None if high is None else high - 1,
                          "+.1%")  # fmt: skip
        line += f", {ratio - 1:+.1%}{shown} over {first.name}"
    elif gain is not None and first is best and len(reached) > 1:
        # the first reads highest: the runner-up against it (gain: runner-up over the first)
        ratio, low, high = gain
        shown = _interval(None if low is None else low - 1, None if high is None else high - 1,
                          "+.1%")  # fmt: skip
        second = max((c for c in reached if c is not best), key=lambda c: c.value or 0.0)
        line += f", {second.name} {ratio - 1:+.1%}{shown} against it"
    line += f" (best of {span})" if unresolved is None else (
        f" (highest of {span}; not resolved: {unresolved})")  # fmt: skip
    missing = [c.name for c in choices if c.value is None]
    if missing:
        line += f"; {', '.join(missing)} do not reach {target:g} tok/s/user (see the table)"
    return line
