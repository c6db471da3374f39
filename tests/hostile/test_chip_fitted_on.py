"""A chip file's ``fitted_on`` (what its efficiency defaults were fitted on, which a prediction
past it names as extrapolation): a reversed concurrency span, a kind of run the data has none
of, or a statement without the defaults it describes is refused in one line naming the file and
the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclens.acceptance import ValidationError
from speclens.sim import catalog

CHIP = (
    "kind: Chip\nname: mine\nsource: measured\ntflops: {bf16: 1.0}\nmemory_gb: 64\n"
    "memory_bandwidth_tbps: 1.0\ninterconnect_gbps: 10\n"
)
EFFICIENCY = "efficiency: {compute: 0.3}\n"


@pytest.mark.parametrize(
    ("lines", "field", "expected"),
    [
        (EFFICIENCY + "fitted_on: {runs: single-node, points: 3, groups: 1, "
         "concurrency: [64, 4]}\n", "fitted_on.concurrency", "expected [lowest, highest]"),
        (EFFICIENCY + "fitted_on: {runs: multi-node, points: 3, groups: 1, "
         "concurrency: [4, 64]}\n", "fitted_on.runs", "single-node"),
        (EFFICIENCY + "fitted_on: {runs: single-node, points: 0, groups: 1, "
         "concurrency: [4, 64]}\n", "fitted_on.points", "greater than or equal to 1"),
        (EFFICIENCY + "fitted_on: {runs: single-node, points: 3, groups: 1, "
         "concurrency: [4]}\n", "fitted_on.concurrency", "at least 2"),
        ("fitted_on: {runs: single-node, points: 3, groups: 1, concurrency: [4, 64]}\n",
         "fitted_on", "gives no efficiency"),
    ],
)  # fmt: skip
def test_a_bad_fitted_on_is_refused_naming_the_file_and_field(
    tmp_path: Path, lines: str, field: str, expected: str
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(CHIP + lines)
    with pytest.raises(ValidationError) as caught:
        catalog.read_chip(path)
    (problem,) = caught.value.problems
    said = str(problem)
    assert said.startswith(f"{path}: {field}"), said
    assert expected in said, said
