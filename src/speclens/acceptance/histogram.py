"""The accepted-count histogram: {j: verify steps that accepted exactly j drafts}, j in 0..K.

The bonus token is excluded from j. The engine's statistics, the client's per-request records, its
pooled figures and the simulator all count steps with this one type, so AL and acceptance rate are
derived here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from speclens.acceptance.errors import Problem, ValidationError
from speclens.acceptance.quantity import acceptance_length, check_num_spec_tokens


class AcceptanceHistogram:
    """A mutable, sparse count of verify steps by the number of drafts each accepted."""

    __slots__ = ("_counts",)

    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self._counts: dict[int, int] = {}
        if counts:
            problems = [p for j, n in counts.items() for p in _entry_problems(j, n)]
            if problems:
                raise ValidationError(problems)
            for j, n in counts.items():
                if n:
                    self._counts[j] = self._counts.get(j, 0) + n

    @classmethod
    def from_accepted(cls, accepted_per_step: Iterable[int]) -> AcceptanceHistogram:
        """Count a sequence of per-step accepted-draft counts."""
        hist = cls()
        for j in accepted_per_step:
            hist.add(j)
        return hist

    @classmethod
    def from_dense(cls, dense: Iterable[int]) -> AcceptanceHistogram:
        """Read a dense list where index j holds the steps that accepted exactly j drafts."""
        return cls(dict(enumerate(dense)))

    def add(self, accepted: int, steps: int = 1) -> None:
        """Count ``steps`` more verify steps that accepted ``accepted`` drafts."""
        problems = _entry_problems(accepted, steps)
        if problems:
            raise ValidationError(problems)
        if steps:
            self._counts[accepted] = self._counts.get(accepted, 0) + steps

    def update(self, other: AcceptanceHistogram) -> None:
        """Add every count of ``other`` into this histogram."""
        for j, n in other._counts.items():
            self._counts[j] = self._counts.get(j, 0) + n

    def __add__(self, other: AcceptanceHistogram) -> AcceptanceHistogram:
        out = AcceptanceHistogram(self._counts)
        out.update(other)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AcceptanceHistogram) and self.counts == other.counts

    def __repr__(self) -> str:
        return f"AcceptanceHistogram({self.counts})"

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(sorted(self._counts.items()))

    def __bool__(self) -> bool:
        return bool(self._counts)

    @property
    def counts(self) -> dict[int, int]:
        """The sparse counts, sorted by j, zero buckets omitted."""
        return {j: n for j, n in sorted(self._counts.items()) if n}

    @property
    def num_steps(self) -> int:
        """Verify steps counted (the histogram's total)."""
        return sum(self._counts.values())

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens: the j-weighted sum, bonus tokens excluded."""
        return sum(j * n for j, n in self._counts.items())

    @property
    def max_accepted(self) -> int:
        """The largest j with a non-zero count (0 for an empty histogram)."""
        return max((j for j, n in self._counts.items() if n), default=0)

    @property
    def acceptance_length(self) -> float:
        """AL = 1 + sum(j * n_j) / sum(n_j); 1.0 when no step was counted."""
        steps = self.num_steps
        return acceptance_length(self.num_accepted, steps)

    def acceptance_rate(self, k: int) -> float:
        """The acceptance rate (AL - 1) / K over K draft positions."""
        self._check_within(k)
        return (self.acceptance_length - 1.0) / k

    def fractions(self) -> dict[int, float]:
        """Each bucket's share of the steps (empty for an empty histogram)."""
        steps = self.num_steps
        return {j: n / steps for j, n in self.counts.items()} if steps else {}

    def dense(self, k: int) -> list[int]:
        """A list of length K + 1 where index j holds the steps that accepted exactly j drafts."""
        self._check_within(k)
        return [self._counts.get(j, 0) for j in range(k + 1)]

    def _check_within(self, k: int) -> None:
        check_num_spec_tokens(k)
        if self.max_accepted > k:
            raise ValidationError.single(
                "acceptance_histogram", f"has a count at {self.max_accepted} > K = {k}"
            )


def _entry_problems(j: object, n: object) -> list[Problem]:
    problems: list[Problem] = []
    if isinstance(j, bool) or not isinstance(j, int) or j < 0:
        problems.append(Problem("", "acceptance_histogram", f"key {j!r} is not an integer >= 0"))
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        problems.append(
            Problem("", f"acceptance_histogram[{j!r}]", f"count {n!r} is not an integer >= 0")
        )
    return problems
