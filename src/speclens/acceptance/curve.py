"""AL at any K from one K: a model of how acceptance falls off along the draft positions.

The model. The conditional acceptance at draft position i (c_i, DESIGN's vocabulary) decays
geometrically, c_i = a * d^(i - 1), so the per-position rates are r_i = a^i * d^(i (i - 1) / 2)
and AL(K) = 1 + sum over i <= K of r_i. Two numbers:

- ``d`` (the decay, 0 < d <= 1) is fitted once on the training curves, InferenceX's golden AL
  curves (the shipped set ``inferencex-golden-al-2026-08``): the d with the least mean relative
  error over every curve, predicting the AL at every K from each single K, searched on a grid
  of 0.01 in [0.5, 1] and then of 0.001 within 0.01 of the best (ties: the smaller d).
- ``a`` (the first draft's acceptance) is what one observation pins: solved by bisection so
  that AL(K_obs) is the observed AL. Where even a = 1 falls short at the fitted d (the
  observation says acceptance decays slower than on the training curves), a = 1 and d is raised
  by bisection in [d, 1] until it does; AL = K + 1 gives a = d = 1.

d = 1 is a constant per-position acceptance, AL(K) = (1 - a^(K+1)) / (1 - a): the baseline the
model is measured against (``constant_rate``). Why the decay: a drafter (MTP, EAGLE, DSpark) is
less sure the further it looks ahead, so the constant rate, fitted at K 2, overstates the AL at
K 8 and understates it at K 1. Why one fitted number and not a shape per position: each golden
AL is measured by its own run per K, so a curve wobbles (4.73 at K 7, 4.71 at K 8); a
per-position template would fit that noise. The model's curve rises with K by construction.

The range. For every pair of Ks (K_obs, K) of every training curve, the log residual
ln(measured / predicted) of the AL at K predicted from the one at K_obs; they are kept by step
(K - K_obs, -7..7). The range at K from K_obs is the prediction times e^min and e^max of the
residuals at that step (widened to hold the prediction itself), clipped to [1, K + 1]. It is an
in-sample envelope: ``benchmarks/al_curve.py`` measures its coverage leaving each golden file
out. An observation with a range of its own (calibrate's AL from a TPOT, within the fit's
residuals) widens it: the low end is predicted from its low AL, the high end from its high.

The model is fitted when first asked for (``shipped()``, cached; a fraction of a second), from
the shipped set itself, so no fitted numbers are stored beside the curves they came from.
Library code: raises ``ValidationError``, one line naming the field; never prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from speclens.acceptance.errors import ValidationError
from speclens.acceptance.quantity import is_finite_number
from speclens.acceptance.registry import ACCEPTANCE_DIR, load_sets, shipped_registry
from speclens.acceptance.schema import AcceptanceProfileSet

#: The Ks the model is fitted on and answers for: the golden curves' K 1..8.
MAX_CURVE_K = 8
CURVE_KS = tuple(range(1, MAX_CURVE_K + 1))
#: The shipped set the model is fitted on.
TRAINING_SET = "inferencex-golden-al-2026-08"
#: The decays the fit tries first (0.50, 0.51, ..., 1.00), then within 0.01 of the best by this.
DECAYS = np.arange(50, 101) / 100.0
FINE_STEP = 0.001
#: Halvings of a bisection: 2^-48 of [0, 1], far below the 2 decimals an AL is published to.
_BISECTIONS = 48
_POSITIONS = np.arange(1, MAX_CURVE_K + 1, dtype=float)
#: K - K_obs for a (K_obs, K) grid: the step a residual is kept by.
_STEPS = _POSITIONS[None, :] - _POSITIONS[:, None]


def lengths(first: np.ndarray | float, decay: np.ndarray | float) -> np.ndarray:
    """AL at K 1..8 for first-draft acceptance ``a`` and decay ``d`` (arrays broadcast; the
    last axis of the result is K)."""
    a = np.asarray(first, dtype=float)[..., None]
    d = np.asarray(decay, dtype=float)[..., None]
    rates = a**_POSITIONS * d ** (_POSITIONS * (_POSITIONS - 1) / 2)
    return 1.0 + np.cumsum(rates, axis=-1)


def _at(first: np.ndarray, decay: np.ndarray, k: np.ndarray) -> np.ndarray:
    curve = lengths(first, decay)
    return np.take_along_axis(curve, (k - 1)[..., None], axis=-1)[..., 0]


def _bisect(low: np.ndarray, high: np.ndarray,
            below: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:  # fmt: skip
    """The point in [low, high] where ``below(x)`` (true below it, elementwise) turns false."""
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        under = below(mid)
        low = np.where(under, mid, low)
        high = np.where(under, high, mid)
    middle: np.ndarray = (low + high) / 2
    return middle


def solve(length: np.ndarray | float, k: np.ndarray | int,
          decay: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(a, d) whose AL at ``k`` is ``length``: a by bisection at ``decay``, or, where a = 1
    falls short there, a = 1 and d raised by bisection in [decay, 1]. Arrays broadcast."""
    al, kk, d = np.broadcast_arrays(np.asarray(length, dtype=float), np.asarray(k, dtype=int),
                                    np.asarray(decay, dtype=float))  # fmt: skip
    ones = np.ones_like(al)
    a = _bisect(np.zeros_like(al), ones, lambda x: _at(x, d, kk) < al)
    short = _at(ones, d, kk) < al
    raised = _bisect(d.copy(), ones, lambda x: _at(ones, x, kk) < al)
    return np.where(short, 1.0, a), np.where(short, raised, d)


def predictions(decay: np.ndarray | float, curves: np.ndarray) -> np.ndarray:
    """The AL at every K predicted from each single K of each curve: ``curves`` [..., 8] (AL at
    K 1..8) gives [..., K_obs, K] (``decay`` broadcasts against the leading axes)."""
    observed = np.asarray(curves, dtype=float)
    d = np.asarray(decay, dtype=float)[..., None]
    a, dd = solve(observed, np.arange(1, MAX_CURVE_K + 1), d)
    return lengths(a, dd)


def constant_rate(length: float, k: int) -> list[float]:
    """The baseline: AL at K 1..8 from AL ``length`` at ``k`` with a constant per-position
    acceptance (d = 1: AL(K) = (1 - a^(K+1)) / (1 - a))."""
    _check(length, k, "")
    a, d = solve(length, k, 1.0)
    return [float(x) for x in lengths(a, d)]


@dataclass(frozen=True)
class TrainingCurve:
    """One golden curve: its profile key without K, the file it came from, AL at K 1..8."""

    name: str
    source: str
    lengths: tuple[float, ...]


@dataclass(frozen=True)
class CurvePoint:
    """The model's AL at one K, and its range."""

    num_spec_tokens: int
    acceptance_length: float
    low: float
    high: float


def _check(length: object, k: object, file: str, what: str = "acceptance_length") -> None:
    """An observation the model can take: K in 1..8, its AL a number in [1, K + 1]."""
    if isinstance(k, bool) or not isinstance(k, int) or k not in CURVE_KS:
        raise ValidationError.single(
            "num_spec_tokens",
            f"K {k!r} lies outside 1..{MAX_CURVE_K}: the model of the AL curve is fitted on "
            f"{TRAINING_SET}'s curves at K 1..{MAX_CURVE_K} and answers for those only",
            file,
        )
    if not is_finite_number(length) or not 1.0 <= length <= k + 1:  # type: ignore[operator]
        raise ValidationError.single(
            what, f"AL {length!r} at K {k} lies outside [1, {k + 1}]", file
        )


@dataclass(frozen=True)
class CurveModel:
    """The fitted decay and the residuals' envelope by step; ``predict`` turns one AL into K 1..8."""

    decay: float
    #: Per step K - K_obs (-7..7, index step + 7): the least and most log residual, 0 included.
    spread: tuple[tuple[float, float], ...]
    training_set: str
    curves: int

    def describe(self) -> str:
        """The model in words, as a profile's provenance and calibrate's output name it."""
        return (
            f"geometric decay of the per-position acceptance (d {self.decay:.3f}) fitted on "
            f"{self.curves} curves of {self.training_set}"
        )

    def predict(self, length: float, k: int, low: float | None = None,
                high: float | None = None, file: str = "") -> list[CurvePoint]:  # fmt: skip
        """AL at K 1..8 through AL ``length`` at ``k``, each with its range; ``low`` and
        ``high`` bound the observation itself (default: the AL). Refuses (one line) a K outside
        1..8 and an AL outside [1, K + 1]."""
        _check(length, k, file)
        low = length if low is None else low
        high = length if high is None else high
        _check(low, k, file, "range")
        _check(high, k, file, "range")
        if not low <= length <= high:
            raise ValidationError.single(
                "range", f"[{low:g}, {high:g}] does not hold the AL {length:g}", file
            )
        mid, bottom, top = (lengths(*solve(x, k, self.decay)) for x in (length, low, high))
        points = []
        for t in CURVE_KS:
            least, most = self.spread[t - k + MAX_CURVE_K - 1]
            value = float(mid[t - 1]) if t != k else float(length)
            floor = 1.0 if t != k else float(low)
            ceiling = t + 1.0 if t != k else float(high)
            points.append(CurvePoint(
                t, value,
                min(value, max(floor, float(bottom[t - 1]) * math.exp(least))),
                max(value, min(ceiling, float(top[t - 1]) * math.exp(most))),
            ))  # fmt: skip
        return points


def training_curves(profile_set: AcceptanceProfileSet, file: str = "") -> list[TrainingCurve]:
    """A profile set's curves: its profiles grouped by model, method, thinking mode and
    category, each with every K in 1..8 (a curve short of one is refused, naming it)."""
    grouped: dict[str, dict[int, float]] = {}
    sources: dict[str, str] = {}
    for profile in profile_set.profiles:
        key = profile.key
        name = f"{key.model}/{key.speculative_method}/thinking-{key.thinking}/{key.category}"
        grouped.setdefault(name, {})[key.num_spec_tokens] = profile.acceptance_length
        sources.setdefault(name, profile.provenance.source if profile.provenance else name)
    curves = []
    for name, by_k in grouped.items():
        missing = [k for k in CURVE_KS if k not in by_k]
        if missing:
            raise ValidationError.single(
                "profiles", f"the curve {name} has no AL at K {', '.join(map(str, missing))}: a "
                f"training curve needs every K in 1..{MAX_CURVE_K}", file,
            )  # fmt: skip
        curves.append(TrainingCurve(name, sources[name], tuple(by_k[k] for k in CURVE_KS)))
    return curves


def fit(curves: Sequence[TrainingCurve], training_set: str, file: str = "") -> CurveModel:
    """The decay with the least mean relative error over ``curves`` (every K from each single
    K) and the residuals' envelope by step. Refuses (one line) no curve, or a curve whose AL
    at some K is not a number in [1, K + 1]."""
    if not curves:
        raise ValidationError.single("profiles", "no training curve: the fit needs one", file)
    for curve in curves:
        if len(curve.lengths) != MAX_CURVE_K:
            raise ValidationError.single(
                curve.name, f"has {len(curve.lengths)} ALs, expected one at each K 1..8", file
            )
        for k, value in zip(CURVE_KS, curve.lengths, strict=True):
            _check(value, k, file, f"{curve.name} at K {k}")
    observed = np.array([c.lengths for c in curves], dtype=float)  # [curve, K]
    coarse = _best_decay(DECAYS, observed)
    steps = np.arange(-10, 11) * FINE_STEP
    fine = np.round(coarse + steps[(coarse + steps >= DECAYS[0]) & (coarse + steps <= 1)], 3)
    decay = _best_decay(fine, observed)
    residuals = np.log(observed[:, None, :] / predictions(decay, observed))  # [curve, K_obs, K]
    spread = []
    for step in range(-(MAX_CURVE_K - 1), MAX_CURVE_K):
        at_step = residuals[:, step == _STEPS]
        spread.append((min(0.0, float(at_step.min())), max(0.0, float(at_step.max()))))
    return CurveModel(decay, tuple(spread), training_set, len(curves))


def _best_decay(grid: np.ndarray, observed: np.ndarray) -> float:
    """The decay of ``grid`` with the least mean relative error over the curves ``observed``
    ([curve, K]), every K predicted from each other single K; the first of equals."""
    predicted = predictions(grid[:, None], observed[None, :, :])  # [decay, curve, K_obs, K]
    off = ~np.eye(MAX_CURVE_K, dtype=bool)
    errors = np.abs(predicted / observed[None, :, None, :] - 1)[..., off]
    return float(grid[int(np.argmin(errors.mean(axis=(1, 2))))])


@functools.cache
def shipped() -> CurveModel:
    """The model fitted on the shipped golden curves (``TRAINING_SET``), once per process."""
    path = shipped_registry() / ACCEPTANCE_DIR / f"{TRAINING_SET}.yaml"
    (registered,) = load_sets([path])
    return fit(training_curves(registered.profile_set, str(path)), TRAINING_SET, str(path))
