"""The acceptance quantity and its derived forms, each under one name.

- acceptance length (AL): tokens gained per verification step, bonus token included, in [1, K + 1];
- acceptance rate: (AL - 1) / K, in [0, 1];
- per-position rates r_1..r_K: r_i = P(the first i drafts are all accepted), non-increasing, each in
  [0, 1], summing to AL - 1;
- conditional rates c_i = r_i / r_(i-1) (r_0 = 1), 0 where r_(i-1) = 0: what a sampler that stops at
  the first rejection draws against.

Every function checks its input and raises ``ValidationError`` naming the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from speclens.acceptance.errors import Problem, ValidationError

#: Per-position rates may miss AL - 1 by this much and still agree with it.
RATES_SUM_TOLERANCE = 0.01

#: Largest K anywhere in speclens (schema, CLI, engine, bench, simulator): a step drafts and
#: verifies K + 1 slots per request and a schedule holds K rates. Published MTP/EAGLE/DSpark setups
#: run K <= 16; the bound keeps a typo (K = 10**9) from turning into an allocation.
MAX_NUM_SPEC_TOKENS = 64

# Rates are rounded to this many decimals so that 3.78 gives 0.78, not 0.7799999999999998.
_DIGITS = 12


def is_finite_number(value: object) -> bool:
    """True for a real, finite int or float (never a bool; an int too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def acceptance_length(accepted: float, steps: float) -> float:
    """AL = 1 + accepted drafts / verify steps, bonus token included; 1.0 when no step was taken.

    The one place the formula lives: every record, figure, sampler tally and simulator reads it here.
    """
    return 1.0 + accepted / steps if steps else 1.0


def num_spec_tokens_problem(k: object) -> str | None:
    """What is wrong with ``k`` as K (None when it is an integer in [1, MAX_NUM_SPEC_TOKENS])."""
    if isinstance(k, bool) or not isinstance(k, int):
        return f"expected an integer, got {k!r}"
    if k < 1:
        return f"must be at least 1, got {k}"
    if k > MAX_NUM_SPEC_TOKENS:
        return f"must be at most {MAX_NUM_SPEC_TOKENS}, got {k}"
    return None


def _num_spec_tokens_problems(k: object, path: str = "num_spec_tokens") -> list[Problem]:
    problem = num_spec_tokens_problem(k)
    return [Problem("", path, problem)] if problem else []


def length_problems(length: object, k: int) -> list[str]:
    """What is wrong with ``length`` as an AL for K draft tokens (empty when valid)."""
    if isinstance(length, bool) or not isinstance(length, int | float):
        return [f"expected a number, got {length!r}"]
    if not is_finite_number(length):
        return ["must be a finite number"]
    if not 1.0 <= length <= k + 1:
        return [f"{length:g} lies outside [1, {k + 1}] (K = {k})"]
    return []


def rate_problems(rate: object) -> list[str]:
    """What is wrong with ``rate`` as an acceptance rate (empty when valid)."""
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        return [f"expected a number, got {rate!r}"]
    if not is_finite_number(rate):
        return ["must be a finite number"]
    if not 0.0 <= rate <= 1.0:
        return [f"{rate:g} lies outside [0, 1]"]
    return []


def rates_problems(
    rates: Sequence[object], k: int | None, path: str = "per_position_rates"
) -> list[Problem]:
    """Every problem with ``rates`` as K per-position rates: entries, count, monotonicity.

    The sum is checked against a stated AL separately (``rates_sum_problem``).
    """
    problems: list[Problem] = []
    for i, r in enumerate(rates):
        for message in rate_problems(r):
            problems.append(Problem("", f"{path}[{i}]", message))
    return problems + rates_shape_problems(rates, k, path)


def rates_shape_problems(
    rates: Sequence[object], k: int | None, path: str = "per_position_rates"
) -> list[Problem]:
    """Count and monotonicity problems of ``rates``; entries that are not valid rates are skipped
    here (``rate_problems`` names them)."""
    problems: list[Problem] = []
    if k is not None and len(rates) != k:
        problems.append(Problem("", path, f"has {len(rates)} entries, expected K = {k}"))
    valid = [float(r) if not rate_problems(r) else None for r in rates]  # type: ignore[arg-type]
    for i in range(1, len(valid)):
        prev, cur = valid[i - 1], valid[i]
        if prev is not None and cur is not None and cur > prev:
            problems.append(Problem("", path, f"rises at position {i + 1} ({cur:g} > {prev:g})"))
    return problems


def rates_sum_problem(rates: Sequence[float], length: float) -> str | None:
    """A message when ``rates`` sum more than the tolerance away from ``length - 1``."""
    total = math.fsum(rates)
    # A hair of slack so that a sum exactly 0.01 off (in decimal) is not refused by binary rounding.
    if abs(total - (length - 1.0)) > RATES_SUM_TOLERANCE + 1e-9:
        return (
            f"sum to {total:.4g}, but acceptance length {length:g} needs {length - 1.0:.4g} "
            f"(within {RATES_SUM_TOLERANCE})"
        )
    return None


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise ValidationError(problems)


def check_num_spec_tokens(k: int) -> int:
    """Return K when it is an integer in [1, MAX_NUM_SPEC_TOKENS], else raise ``ValidationError``."""
    _raise(_num_spec_tokens_problems(k))
    return k


def check_length(length: float, k: int) -> float:
    """Return ``length`` as a float when it is a valid AL for K, else raise ``ValidationError``."""
    check_num_spec_tokens(k)
    _raise([Problem("", "acceptance_length", m) for m in length_problems(length, k)])
    return float(length)


def check_rates(rates: Sequence[float], k: int | None = None) -> list[float]:
    """Return ``rates`` as floats when they are valid per-position rates (for K, when given)."""
    if k is not None:
        check_num_spec_tokens(k)
    _raise(rates_problems(rates, k))
    return [float(r) for r in rates]


def acceptance_rate(length: float, k: int) -> float:
    """The acceptance rate of an AL over K draft positions: (AL - 1) / K."""
    length = check_length(length, k)
    return round((length - 1.0) / k, _DIGITS)


def length_from_rate(rate: float, k: int) -> float:
    """The AL of an acceptance rate over K draft positions: 1 + K * rate."""
    check_num_spec_tokens(k)
    _raise([Problem("", "acceptance_rate", m) for m in rate_problems(rate)])
    return round(1.0 + k * float(rate), _DIGITS)


def length_from_rates(rates: Sequence[float]) -> float:
    """The AL that per-position rates imply: 1 + their sum."""
    rates = check_rates(rates)
    return round(1.0 + math.fsum(rates), _DIGITS)


def minimum_variance_rates(length: float, k: int) -> list[float]:
    """The minimum-variance schedule: accept floor(AL - 1) positions outright, the next one with
    the leftover fraction, none after; truncated to K. (vLLM's ``_acceptance_length_to_rates``.)

    >>> minimum_variance_rates(3.78, 7)
    [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    """
    length = check_length(length, k)
    excess = round(length - 1.0, _DIGITS)
    whole = math.floor(excess)
    frac = round(excess - whole, _DIGITS)
    rates = [1.0] * whole + [frac] + [0.0] * k
    return rates[:k]


def is_minimum_variance(rates: Sequence[float]) -> bool:
    """``rates`` are the minimum-variance schedule of their own AL (to 1e-9 a position): a
    request's own schedule under a spread is then the minimum-variance one at its AL too."""
    schedule = minimum_variance_rates(length_from_rates(rates), len(rates))
    return all(abs(a - b) <= 1e-9 for a, b in zip(rates, schedule, strict=True))


def conditional_rates(rates: Sequence[float]) -> list[float]:
    """c_i = r_i / r_(i-1) with r_0 = 1, and 0 where r_(i-1) = 0: P(accept i | accepted 1..i-1)."""
    rates = check_rates(rates)
    out: list[float] = []
    prev = 1.0
    for r in rates:
        out.append(min(1.0, round(r / prev, _DIGITS)) if prev > 0.0 else 0.0)
        prev = r
    return out


def accepted_count_distribution(rates: Sequence[float]) -> dict[int, float]:
    """P(exactly j drafts accepted) for j = 0..K under the schedule; zero entries omitted.

    P(j) = r_j - r_(j+1) with r_0 = 1 and r_(K+1) = 0.

    >>> accepted_count_distribution(minimum_variance_rates(3.78, 7))
    {2: 0.22, 3: 0.78}
    """
    rates = check_rates(rates)
    padded = [1.0, *rates, 0.0]
    dist: dict[int, float] = {}
    for j in range(len(rates) + 1):
        p = round(padded[j] - padded[j + 1], _DIGITS)
        if p > 0.0:
            dist[j] = p
    return dist
