"""A workload's lengths as a dataset's own (``input_tokens: {values: [...]}``): each request
draws one of the listed lengths, each equally likely, and min and max are theirs; bad lists are
refused in one line naming the field."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from speclens.acceptance import ValidationError, validate
from speclens.sim.scenario import MAX_LENGTH_VALUES, Lengths, Workload
from speclens.sim.simulate import arrivals


def test_requests_draw_the_listed_lengths_each_equally_likely() -> None:
    listed = [12, 51, 51, 300, 1024]
    workload = validate(Workload, {"input_tokens": {"values": listed}, "output_tokens": 64,
                                   "requests": 20_000, "concurrency": 4})  # fmt: skip
    drawn = Counter(r.input_tokens for r in arrivals(workload, seed=3))
    assert set(drawn) == set(listed)
    n = sum(drawn.values())
    for value, count in Counter(listed).items():
        share = count / len(listed)
        # 4 binomial standard errors of the value's share
        assert abs(drawn[value] / n - share) < 4 * np.sqrt(share * (1 - share) / n)
    assert workload.input_tokens.min == 12 and workload.input_tokens.max == 1024


def test_uniform_lengths_draw_as_before() -> None:
    workload = validate(Workload, {"input_tokens": {"min": 10, "max": 20}, "requests": 500})
    drawn = [r.input_tokens for r in arrivals(workload, seed=1)]
    assert min(drawn) == 10 and max(drawn) == 20 and len(set(drawn)) == 11


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"values": [3, 5], "min": 2}, "min", "is not allowed with values"),
        ({"values": []}, "values", "is empty"),
        ({"values": [0, 3]}, "values[0]", "greater than or equal to 1"),
        ({"values": ["a"]}, "values[0]", "expected an integer"),
        ({"values": [1] * (MAX_LENGTH_VALUES + 1)}, "values", "over the limit of 100,000"),
    ],
)
def test_a_bad_list_of_lengths_is_refused_naming_the_field(
    spec: dict, field: str, words: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        validate(Lengths, spec, file="scenario.yaml")
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"scenario.yaml: {field}: "), lines
    assert words in lines[0]
