"""A chip file's scale-up domain and scale-out bandwidth (as a user or ``calibrate --host``
writes one): a zero, negative, non-finite or mistyped value would price a collective wider than
the domain at an infinite, negative or free time. Each is refused in one line naming the file
and the field; a scale-out figure without a domain (never used) is refused too."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclens.acceptance import ValidationError
from speclens.sim import catalog

CHIP = (
    "kind: Chip\nname: mine\nsource: measured\ntflops: {bf16: 1.0}\nmemory_gb: 64\n"
    "memory_bandwidth_tbps: 1.0\ninterconnect_gbps: 10\n"
)
DOMAIN = "scale_up_domain: 8\n"


@pytest.mark.parametrize(
    ("lines", "field", "expected"),
    [
        ("scale_up_domain: 0\n", "scale_up_domain", "greater than or equal to 1"),
        ("scale_up_domain: -8\n", "scale_up_domain", "greater than or equal to 1"),
        ("scale_up_domain: '8'\n", "scale_up_domain", "expected an integer, got a string"),
        ("scale_up_domain: 8.5\n", "scale_up_domain", "expected an integer, got a number"),
        ("scale_up_domain: true\n", "scale_up_domain", "expected an integer, got a boolean"),
        (DOMAIN + "scale_out_gbps: 0\n", "scale_out_gbps", "greater than 0"),
        (DOMAIN + "scale_out_gbps: -50\n", "scale_out_gbps", "greater than 0"),
        (DOMAIN + "scale_out_gbps: '50'\n", "scale_out_gbps", "expected a number, got a string"),
        (DOMAIN + "scale_out_gbps: .inf\n", "scale_out_gbps", "finite number"),
        (DOMAIN + "scale_out_gbps: .nan\n", "scale_out_gbps", "finite number"),
        ("scale_out_gbps: 50\n", "scale_out_gbps", "never used without scale_up_domain"),
    ],
)
def test_a_bad_scale_field_is_refused_naming_the_file_and_field(
    tmp_path: Path, lines: str, field: str, expected: str
) -> None:
    path = tmp_path / "chip.yaml"
    path.write_text(CHIP + lines)
    with pytest.raises(ValidationError) as info:
        catalog.resolve_chip(str(path))
    problems = [str(p) for p in info.value.problems]
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}: {field}: "), problems
    assert expected in problems[0] and "\n" not in problems[0], problems


def test_both_fields_stated_or_neither_load(tmp_path: Path) -> None:
    path = tmp_path / "chip.yaml"
    path.write_text(CHIP)
    assert catalog.resolve_chip(str(path)).link_gbps(1_000) == 10.0
    path.write_text(CHIP + DOMAIN + "scale_out_gbps: 2.5\n")
    chip = catalog.resolve_chip(str(path))
    assert (chip.link_gbps(8), chip.link_gbps(9)) == (10.0, 2.5)
