"""The accepted-count histogram: {j: verify steps that accepted exactly j drafts}."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speclens.acceptance import AcceptanceHistogram, ValidationError

FAST = settings(max_examples=200, deadline=None)

counts_maps = st.dictionaries(
    st.integers(min_value=0, max_value=16), st.integers(min_value=0, max_value=1000), max_size=17
)


# --- construction -----------------------------------------------------------------------------


def test_empty_histogram() -> None:
    hist = AcceptanceHistogram()
    assert hist.counts == {}
    assert hist.num_steps == 0
    assert hist.num_accepted == 0
    assert hist.acceptance_length == 1.0
    assert hist.fractions() == {}
    assert not hist
    assert hist == AcceptanceHistogram({})
    assert hist == AcceptanceHistogram(None)


def test_from_dict() -> None:
    hist = AcceptanceHistogram({3: 78, 2: 22})
    assert hist.counts == {2: 22, 3: 78}
    assert list(hist.counts) == [2, 3]
    assert hist.num_steps == 100
    assert hist.num_accepted == 2 * 22 + 3 * 78
    assert hist.acceptance_length == pytest.approx(3.78)
    assert hist


def test_counts_is_sorted_and_omits_zero_buckets() -> None:
    hist = AcceptanceHistogram({5: 1, 0: 0, 2: 3, 1: 0, 4: 2})
    assert list(hist.counts.items()) == [(2, 3), (4, 2), (5, 1)]


def test_counts_is_a_copy() -> None:
    hist = AcceptanceHistogram({1: 2})
    hist.counts[1] = 99
    hist.counts[7] = 1
    assert hist.counts == {1: 2}


def test_all_zero_histogram_is_empty() -> None:
    hist = AcceptanceHistogram({0: 0, 3: 0})
    assert hist.counts == {}
    assert hist.num_steps == 0
    assert hist.acceptance_length == 1.0
    assert hist == AcceptanceHistogram()


def test_iteration_is_sorted_pairs() -> None:
    assert list(AcceptanceHistogram({4: 1, 0: 2, 2: 5})) == [(0, 2), (2, 5), (4, 1)]


def test_fully_rejected_histogram() -> None:
    hist = AcceptanceHistogram({0: 10})
    assert hist.num_steps == 10
    assert hist.num_accepted == 0
    assert hist.acceptance_length == 1.0
    assert hist.acceptance_rate(7) == 0.0


# --- invalid entries --------------------------------------------------------------------------


@pytest.mark.parametrize("key", [-1, True, False, 1.0, "1", None, (1,)])
def test_invalid_key_is_refused(key: object) -> None:
    with pytest.raises(ValidationError) as exc:
        AcceptanceHistogram({key: 1})  # type: ignore[dict-item]
    assert exc.value.problems[0].path == "acceptance_histogram"


@pytest.mark.parametrize("count", [-1, True, False, 1.0, 2.5, "3", None])
def test_invalid_count_is_refused(count: object) -> None:
    with pytest.raises(ValidationError) as exc:
        AcceptanceHistogram({2: count})  # type: ignore[dict-item]
    assert exc.value.problems[0].path == "acceptance_histogram[2]"


def test_every_invalid_entry_is_reported() -> None:
    with pytest.raises(ValidationError) as exc:
        AcceptanceHistogram({-1: 1, 2: -5, 3: 4})  # type: ignore[dict-item]
    paths = [p.path for p in exc.value.problems]
    assert paths == ["acceptance_histogram", "acceptance_histogram[2]"]


@pytest.mark.parametrize("dense", [[1, -1], [1, True], [0, 2.0], [None]])
def test_from_dense_refuses_invalid_counts(dense: list[object]) -> None:
    with pytest.raises(ValidationError):
        AcceptanceHistogram.from_dense(dense)  # type: ignore[arg-type]


@pytest.mark.parametrize("accepted", [-1, True, 1.0, "1"], ids=["neg", "bool", "float", "str"])
def test_add_refuses_invalid_key(accepted: object) -> None:
    hist = AcceptanceHistogram()
    with pytest.raises(ValidationError):
        hist.add(accepted)  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [-1, True, 1.5, "2"])
def test_add_refuses_invalid_count(steps: object) -> None:
    hist = AcceptanceHistogram({2: 3})
    with pytest.raises(ValidationError):
        hist.add(2, steps)  # type: ignore[arg-type]


@pytest.mark.parametrize("accepted", [[1, -1], [0, True], [2, 1.0]])
def test_from_accepted_refuses_invalid_values(accepted: list[object]) -> None:
    with pytest.raises(ValidationError):
        AcceptanceHistogram.from_accepted(accepted)  # type: ignore[arg-type]


# --- add, update, + ---------------------------------------------------------------------------


def test_add_defaults_to_one_step() -> None:
    hist = AcceptanceHistogram()
    hist.add(3)
    hist.add(3)
    hist.add(0)
    assert hist.counts == {0: 1, 3: 2}


def test_add_with_steps_accumulates() -> None:
    hist = AcceptanceHistogram({2: 1})
    hist.add(2, 4)
    hist.add(5, 2)
    assert hist.counts == {2: 5, 5: 2}
    assert hist.num_steps == 7


def test_add_zero_steps_creates_no_bucket() -> None:
    hist = AcceptanceHistogram()
    hist.add(4, 0)
    assert hist.counts == {}
    assert hist.max_accepted == 0
    assert hist.dense(1) == [0, 0]


def test_update_adds_other_counts_and_leaves_other_alone() -> None:
    hist = AcceptanceHistogram({0: 1, 2: 3})
    other = AcceptanceHistogram({2: 1, 4: 5})
    hist.update(other)
    assert hist.counts == {0: 1, 2: 4, 4: 5}
    assert other.counts == {2: 1, 4: 5}


def test_update_with_itself_doubles() -> None:
    hist = AcceptanceHistogram({1: 2, 3: 1})
    hist.update(hist)
    assert hist.counts == {1: 4, 3: 2}


def test_add_operator_does_not_mutate_operands() -> None:
    left = AcceptanceHistogram({0: 1, 2: 3})
    right = AcceptanceHistogram({2: 1, 4: 5})
    total = left + right
    assert total.counts == {0: 1, 2: 4, 4: 5}
    assert left.counts == {0: 1, 2: 3}
    assert right.counts == {2: 1, 4: 5}
    assert total is not left
    assert total is not right
    total.add(0, 10)
    assert left.counts == {0: 1, 2: 3}


def test_add_operator_with_empty() -> None:
    hist = AcceptanceHistogram({1: 2})
    assert hist + AcceptanceHistogram() == hist
    assert AcceptanceHistogram() + hist == hist


# --- equality ---------------------------------------------------------------------------------


def test_equality() -> None:
    assert AcceptanceHistogram({1: 2, 3: 4}) == AcceptanceHistogram({3: 4, 1: 2})
    assert AcceptanceHistogram({1: 2, 3: 0}) == AcceptanceHistogram({1: 2})
    assert AcceptanceHistogram({1: 2}) != AcceptanceHistogram({1: 3})
    assert AcceptanceHistogram({1: 2}) != AcceptanceHistogram({2: 2})
    assert AcceptanceHistogram({1: 2}) != {1: 2}
    assert AcceptanceHistogram() != AcceptanceHistogram({0: 1})


def test_repr_shows_counts() -> None:
    assert repr(AcceptanceHistogram({3: 1, 1: 2})) == "AcceptanceHistogram({1: 2, 3: 1})"


# --- derived quantities -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({0: 1, 1: 1, 2: 1, 3: 1}, 2.5),
        ({7: 4}, 8.0),
        ({0: 3, 4: 1}, 2.0),
        ({1: 1}, 2.0),
    ],
)
def test_acceptance_length(counts: dict[int, int], expected: float) -> None:
    assert AcceptanceHistogram(counts).acceptance_length == pytest.approx(expected)


def test_acceptance_rate_is_al_minus_one_over_k() -> None:
    hist = AcceptanceHistogram({2: 22, 3: 78})
    assert hist.acceptance_rate(7) == pytest.approx(2.78 / 7)
    assert hist.acceptance_rate(3) == pytest.approx(2.78 / 3)


def test_acceptance_rate_of_empty_histogram_is_zero() -> None:
    assert AcceptanceHistogram().acceptance_rate(5) == 0.0


@pytest.mark.parametrize("k", [0, -1, True, 3.0, None])
def test_acceptance_rate_refuses_bad_num_spec_tokens(k: object) -> None:
    with pytest.raises(ValidationError) as exc:
        AcceptanceHistogram({1: 1}).acceptance_rate(k)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "num_spec_tokens"


def test_fractions() -> None:
    fractions = AcceptanceHistogram({0: 1, 2: 3, 5: 0}).fractions()
    assert fractions == pytest.approx({0: 0.25, 2: 0.75})
    assert list(fractions) == [0, 2]


def test_max_accepted() -> None:
    assert AcceptanceHistogram().max_accepted == 0
    assert AcceptanceHistogram({1: 3, 6: 1}).max_accepted == 6


# --- dense ------------------------------------------------------------------------------------


def test_dense_has_length_k_plus_one() -> None:
    hist = AcceptanceHistogram({0: 2, 3: 5})
    assert hist.dense(3) == [2, 0, 0, 5]
    assert hist.dense(5) == [2, 0, 0, 5, 0, 0]


def test_dense_of_empty_histogram() -> None:
    assert AcceptanceHistogram().dense(2) == [0, 0, 0]


def test_dense_refuses_count_beyond_k() -> None:
    with pytest.raises(ValidationError) as exc:
        AcceptanceHistogram({0: 1, 4: 1}).dense(3)
    assert exc.value.problems[0].path == "acceptance_histogram"


@pytest.mark.parametrize("k", [0, -2, True, 2.0])
def test_dense_refuses_bad_num_spec_tokens(k: object) -> None:
    with pytest.raises(ValidationError) as exc:
        AcceptanceHistogram({0: 1}).dense(k)  # type: ignore[arg-type]
    assert exc.value.problems[0].path == "num_spec_tokens"


def test_from_dense() -> None:
    hist = AcceptanceHistogram.from_dense([2, 0, 0, 5])
    assert hist.counts == {0: 2, 3: 5}
    assert hist.dense(3) == [2, 0, 0, 5]


def test_from_dense_accepts_any_iterable() -> None:
    assert AcceptanceHistogram.from_dense(iter([0, 1])) == AcceptanceHistogram({1: 1})


def test_from_dense_empty() -> None:
    assert AcceptanceHistogram.from_dense([]) == AcceptanceHistogram()
    assert AcceptanceHistogram.from_dense([0, 0, 0]) == AcceptanceHistogram()


def test_from_accepted() -> None:
    hist = AcceptanceHistogram.from_accepted([3, 0, 3, 2, 3])
    assert hist.counts == {0: 1, 2: 1, 3: 3}
    assert hist.acceptance_length == pytest.approx(1.0 + 11 / 5)


# --- properties -------------------------------------------------------------------------------


@FAST
@given(st.lists(st.integers(min_value=0, max_value=16), max_size=200))
def test_from_accepted_properties(accepted: list[int]) -> None:
    hist = AcceptanceHistogram.from_accepted(accepted)
    assert hist.num_steps == len(accepted)
    assert hist.num_accepted == sum(accepted)
    expected_al = 1.0 + sum(accepted) / len(accepted) if accepted else 1.0
    assert hist.acceptance_length == pytest.approx(expected_al, abs=1e-12)
    assert hist.counts == {j: accepted.count(j) for j in sorted(set(accepted))}


@FAST
@given(counts_maps, st.integers(min_value=16, max_value=20))
def test_dense_round_trip(counts: dict[int, int], k: int) -> None:
    hist = AcceptanceHistogram(counts)
    dense = hist.dense(k)
    assert len(dense) == k + 1
    assert sum(dense) == hist.num_steps
    assert AcceptanceHistogram.from_dense(dense) == hist


@FAST
@given(counts_maps)
def test_counts_are_sorted_positive_and_match_input(counts: dict[int, int]) -> None:
    hist = AcceptanceHistogram(counts)
    keys = list(hist.counts)
    assert keys == sorted(keys)
    assert all(n > 0 for n in hist.counts.values())
    assert hist.counts == {j: n for j, n in counts.items() if n}
    assert hist.num_steps == sum(counts.values())
    assert hist.num_accepted == sum(j * n for j, n in counts.items())
    if hist.num_steps:
        assert sum(hist.fractions().values()) == pytest.approx(1.0, abs=1e-12)
        al = 1.0 + sum(j * f for j, f in hist.fractions().items())
        assert hist.acceptance_length == pytest.approx(al, abs=1e-9)


@FAST
@given(counts_maps, counts_maps)
def test_sum_is_commutative_and_matches_update(a: dict[int, int], b: dict[int, int]) -> None:
    left, right = AcceptanceHistogram(a), AcceptanceHistogram(b)
    total = left + right
    assert total == right + left
    assert total.num_steps == left.num_steps + right.num_steps
    assert total.num_accepted == left.num_accepted + right.num_accepted
    updated = AcceptanceHistogram(a)
    updated.update(right)
    assert updated == total
    assert left == AcceptanceHistogram(a)
    assert right == AcceptanceHistogram(b)
