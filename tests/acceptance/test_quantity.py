"""The acceptance quantity and its derived forms (spec 001, "The quantity")."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speclens.acceptance import (
    ValidationError,
    acceptance_rate,
    accepted_count_distribution,
    conditional_rates,
    length_from_rate,
    length_from_rates,
    minimum_variance_rates,
)

FAST = settings(max_examples=200, deadline=None)

NON_NUMBERS = [True, False, None, "2.0", [2.0], complex(2, 0)]
NON_FINITE = [math.nan, math.inf, -math.inf]


def _paths(exc: pytest.ExceptionInfo[ValidationError]) -> list[str]:
    return [p.path for p in exc.value.problems]


# --- strategies -------------------------------------------------------------------------------


@st.composite
def k_and_length(draw: st.DrawFn) -> tuple[int, float]:
    k = draw(st.integers(min_value=1, max_value=16))
    length = draw(st.floats(min_value=1.0, max_value=k + 1.0, allow_nan=False))
    return k, length


@st.composite
def non_increasing_rates(draw: st.DrawFn) -> list[float]:
    values = draw(
        st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=16)
    )
    return sorted(values, reverse=True)


# --- acceptance_rate --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "k", "expected"),
    [
        (3.78, 7, 2.78 / 7),
        (1.0, 7, 0.0),
        (8.0, 7, 1.0),
        (3, 4, 0.5),
        (4.07, 5, 0.614),
        (1.5, 1, 0.5),
    ],
)
def test_acceptance_rate_is_al_minus_one_over_k(length: float, k: int, expected: float) -> None:
    assert acceptance_rate(length, k) == pytest.approx(expected, abs=1e-12)


def test_acceptance_rate_returns_float_for_int_length() -> None:
    result = acceptance_rate(3, 4)
    assert isinstance(result, float)
    assert result == 0.5


@pytest.mark.parametrize(("length", "k"), [(0.99, 7), (8.01, 7), (0.0, 1), (2.5, 1), (-1.0, 3)])
def test_acceptance_rate_refuses_length_out_of_range(length: float, k: int) -> None:
    with pytest.raises(ValidationError) as exc:
        acceptance_rate(length, k)
    assert exc.value.problems[0].path == "acceptance_length"


@pytest.mark.parametrize("length", NON_NUMBERS + NON_FINITE)
def test_acceptance_rate_refuses_non_numbers_and_non_finite(length: object) -> None:
    with pytest.raises(ValidationError) as exc:
        acceptance_rate(length, 7)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "acceptance_length"


@pytest.mark.parametrize("k", [0, -1, True, False, 7.0, "7", None])
def test_acceptance_rate_refuses_bad_num_spec_tokens(k: object) -> None:
    with pytest.raises(ValidationError) as exc:
        acceptance_rate(2.0, k)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "num_spec_tokens"


def test_validation_error_is_a_value_error_and_names_the_field_in_its_message() -> None:
    with pytest.raises(ValueError, match="acceptance_length") as exc:
        acceptance_rate(9.0, 7)
    assert isinstance(exc.value, ValidationError)


# --- length_from_rate -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "k", "expected"),
    [(0.5, 4, 3.0), (0.0, 7, 1.0), (1.0, 7, 8.0), (0, 3, 1.0), (1, 3, 4.0), (0.39, 7, 3.73)],
)
def test_length_from_rate_is_one_plus_k_times_rate(rate: float, k: int, expected: float) -> None:
    assert length_from_rate(rate, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("rate", [-0.01, 1.01, 2.0, -1])
def test_length_from_rate_refuses_rate_out_of_range(rate: float) -> None:
    with pytest.raises(ValidationError) as exc:
        length_from_rate(rate, 7)
    assert exc.value.problems[0].path == "acceptance_rate"


@pytest.mark.parametrize("rate", NON_NUMBERS + NON_FINITE)
def test_length_from_rate_refuses_non_numbers_and_non_finite(rate: object) -> None:
    with pytest.raises(ValidationError) as exc:
        length_from_rate(rate, 7)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "acceptance_rate"


@pytest.mark.parametrize("k", [0, -3, True, 2.0, None])
def test_length_from_rate_refuses_bad_num_spec_tokens(k: object) -> None:
    with pytest.raises(ValidationError) as exc:
        length_from_rate(0.5, k)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "num_spec_tokens"


# --- length_from_rates ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([0.9, 0.5, 0.2], 2.6),
        ([1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0], 3.78),
        ([0.0], 1.0),
        ([1, 1, 1], 4.0),
    ],
)
def test_length_from_rates_is_one_plus_sum(rates: list[float], expected: float) -> None:
    assert length_from_rates(rates) == pytest.approx(expected, abs=1e-12)


def test_length_from_rates_accepts_a_tuple() -> None:
    assert length_from_rates((0.5, 0.25)) == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("rates", "index"),
    [
        ([0.9, 1.5, 0.2], 1),
        ([-0.1], 0),
        ([1.0, 0.5, math.nan], 2),
        ([math.inf, 0.5], 0),
        ([0.9, True, 0.2], 1),
        ([0.9, 0.5, "0.2"], 2),
        ([0.9, None], 1),
    ],
)
def test_length_from_rates_names_the_bad_entry(rates: list[object], index: int) -> None:
    with pytest.raises(ValidationError) as exc:
        length_from_rates(rates)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == f"per_position_rates[{index}]"


def test_length_from_rates_reports_every_bad_entry() -> None:
    with pytest.raises(ValidationError) as exc:
        length_from_rates([-1.0, 0.5, 2.0])
    assert "per_position_rates[0]" in _paths(exc)
    assert "per_position_rates[2]" in _paths(exc)


def test_length_from_rates_refuses_rising_rates() -> None:
    with pytest.raises(ValidationError) as exc:
        length_from_rates([0.5, 0.6])
    assert exc.value.problems[0].path == "per_position_rates"
    assert "position 2" in exc.value.problems[0].message


# --- minimum_variance_rates -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "k", "expected"),
    [
        (3.78, 7, [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]),
        (3.51, 5, [1.0, 1.0, 0.51, 0.0, 0.0]),
        (3.0, 7, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        (3, 7, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        (8.0, 7, [1.0] * 7),
        (1.0, 7, [0.0] * 7),
        (1, 1, [0.0]),
        (2, 1, [1.0]),
        (1.5, 1, [0.5]),
        (4.07, 5, [1.0, 1.0, 1.0, 0.07, 0.0]),
        (5.9, 5, [1.0, 1.0, 1.0, 1.0, 0.9]),
    ],
)
def test_minimum_variance_rates_exact(length: float, k: int, expected: list[float]) -> None:
    # Exact equality: the 12-decimal rounding makes 3.78 give 0.78, not 0.7799999999999998.
    assert minimum_variance_rates(length, k) == expected


@pytest.mark.parametrize("k", range(1, 17))
def test_minimum_variance_rates_at_the_top_of_the_range_is_all_ones(k: int) -> None:
    assert minimum_variance_rates(k + 1, k) == [1.0] * k
    assert minimum_variance_rates(float(k + 1), k) == [1.0] * k


@pytest.mark.parametrize("k", range(1, 17))
def test_minimum_variance_rates_at_one_is_all_zeros(k: int) -> None:
    assert minimum_variance_rates(1.0, k) == [0.0] * k


def test_minimum_variance_rates_returns_floats() -> None:
    assert all(type(r) is float for r in minimum_variance_rates(3, 4))


@pytest.mark.parametrize(("length", "k"), [(8.01, 7), (0.5, 7), (3.0, 1)])
def test_minimum_variance_rates_refuses_length_out_of_range(length: float, k: int) -> None:
    with pytest.raises(ValidationError) as exc:
        minimum_variance_rates(length, k)
    assert exc.value.problems[0].path == "acceptance_length"


@pytest.mark.parametrize("length", NON_NUMBERS + NON_FINITE)
def test_minimum_variance_rates_refuses_non_numbers(length: object) -> None:
    with pytest.raises(ValidationError) as exc:
        minimum_variance_rates(length, 7)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "acceptance_length"


@pytest.mark.parametrize("k", [0, -1, True, 7.0])
def test_minimum_variance_rates_refuses_bad_num_spec_tokens(k: object) -> None:
    with pytest.raises(ValidationError) as exc:
        minimum_variance_rates(2.0, k)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "num_spec_tokens"


# --- conditional_rates ------------------------------------------------------------------------


def test_conditional_rates_vllm_example() -> None:
    assert conditional_rates([0.9, 0.5, 0.2]) == pytest.approx([0.9, 0.5 / 0.9, 0.4], abs=1e-12)


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([1.0, 1.0, 0.78, 0.0, 0.0], [1.0, 1.0, 0.78, 0.0, 0.0]),
        ([0.0, 0.0], [0.0, 0.0]),
        ([0.5, 0.0, 0.0], [0.5, 0.0, 0.0]),
        ([0.8, 0.4, 0.1], [0.8, 0.5, 0.25]),
        ([1.0], [1.0]),
        ([0.3, 0.3], [0.3, 1.0]),
    ],
)
def test_conditional_rates(rates: list[float], expected: list[float]) -> None:
    assert conditional_rates(rates) == pytest.approx(expected, abs=1e-12)


def test_conditional_rate_is_zero_after_a_zero_rate() -> None:
    # r_(i-1) = 0 defines c_i = 0, not a division by zero.
    assert conditional_rates([0.6, 0.0, 0.0])[1:] == [0.0, 0.0]


def test_conditional_rates_refuse_rising_rates() -> None:
    with pytest.raises(ValidationError) as exc:
        conditional_rates([0.2, 0.5])
    assert exc.value.problems[0].path == "per_position_rates"


@pytest.mark.parametrize("bad", [1.2, -0.2, math.nan, True])
def test_conditional_rates_refuse_bad_entries(bad: object) -> None:
    with pytest.raises(ValidationError) as exc:
        conditional_rates([1.0, bad])  # type: ignore[list-item]
    assert exc.value.problems[0].path == "per_position_rates[1]"


# --- accepted_count_distribution --------------------------------------------------------------


def test_accepted_count_distribution_of_minimum_variance_schedule() -> None:
    assert accepted_count_distribution(minimum_variance_rates(3.78, 7)) == {2: 0.22, 3: 0.78}


def test_accepted_count_distribution_vllm_example() -> None:
    dist = accepted_count_distribution([0.9, 0.5, 0.2])
    assert sorted(dist) == [0, 1, 2, 3]
    assert dist == pytest.approx({0: 0.1, 1: 0.4, 2: 0.3, 3: 0.2}, abs=1e-12)


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([0.0, 0.0, 0.0], {0: 1.0}),
        ([1.0, 1.0, 1.0], {3: 1.0}),
        ([1.0, 0.5], {1: 0.5, 2: 0.5}),
    ],
)
def test_accepted_count_distribution_omits_zero_entries(
    rates: list[float], expected: dict[int, float]
) -> None:
    assert accepted_count_distribution(rates) == expected


def test_accepted_count_distribution_refuses_rising_rates() -> None:
    with pytest.raises(ValidationError) as exc:
        accepted_count_distribution([0.1, 0.9])
    assert exc.value.problems[0].path == "per_position_rates"


# --- properties -------------------------------------------------------------------------------


@FAST
@given(k_and_length())
def test_minimum_variance_rates_shape(case: tuple[int, float]) -> None:
    k, length = case
    rates = minimum_variance_rates(length, k)
    assert len(rates) == k
    assert all(0.0 <= r <= 1.0 for r in rates)
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert math.fsum(rates) == pytest.approx(length - 1.0, abs=1e-9)
    assert sum(1 for r in rates if r not in (0.0, 1.0)) <= 1


@FAST
@given(k_and_length())
def test_rate_round_trip(case: tuple[int, float]) -> None:
    k, length = case
    rate = acceptance_rate(length, k)
    assert 0.0 <= rate <= 1.0
    assert length_from_rate(rate, k) == pytest.approx(length, abs=1e-9)


@FAST
@given(k_and_length())
def test_length_from_minimum_variance_rates_round_trip(case: tuple[int, float]) -> None:
    k, length = case
    assert length_from_rates(minimum_variance_rates(length, k)) == pytest.approx(length, abs=1e-9)


@FAST
@given(k_and_length())
def test_minimum_variance_distribution_sums_to_one_with_mean_al_minus_one(
    case: tuple[int, float],
) -> None:
    k, length = case
    dist = accepted_count_distribution(minimum_variance_rates(length, k))
    assert all(0 <= j <= k for j in dist)
    assert all(p > 0.0 for p in dist.values())
    assert math.fsum(dist.values()) == pytest.approx(1.0, abs=1e-9)
    assert math.fsum(j * p for j, p in dist.items()) == pytest.approx(length - 1.0, abs=1e-9)
    # Minimum variance: at most two adjacent counts occur.
    assert len(dist) <= 2
    assert max(dist) - min(dist) <= 1


@FAST
@given(non_increasing_rates())
def test_distribution_mean_equals_sum_of_rates(rates: list[float]) -> None:
    dist = accepted_count_distribution(rates)
    assert all(0 <= j <= len(rates) for j in dist)
    assert math.fsum(dist.values()) == pytest.approx(1.0, abs=1e-9)
    assert math.fsum(j * p for j, p in dist.items()) == pytest.approx(math.fsum(rates), abs=1e-9)


@FAST
@given(non_increasing_rates())
def test_conditional_rates_multiply_back_to_the_rates(rates: list[float]) -> None:
    conditional = conditional_rates(rates)
    assert len(conditional) == len(rates)
    assert all(0.0 <= c <= 1.0 for c in conditional)
    product = 1.0
    prev = 1.0
    for r, c in zip(rates, conditional, strict=True):
        if prev == 0.0:
            assert c == 0.0
        product *= c
        assert product == pytest.approx(r, abs=1e-9)
        prev = r


@FAST
@given(
    st.integers(min_value=1, max_value=16),
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)
def test_minimum_variance_rates_monotone_in_length(k: int, a: float, b: float) -> None:
    low, high = sorted((1.0 + a * k, 1.0 + b * k))
    lo_rates = minimum_variance_rates(low, k)
    hi_rates = minimum_variance_rates(high, k)
    assert all(x <= y for x, y in zip(lo_rates, hi_rates, strict=True))
