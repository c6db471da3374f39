"""A typo in a key of any of our files (a sweep file, a scenario, a profile set) is named by its
line and column, never by its text, with the valid key nearest to it where one is near."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclens.acceptance import ValidationError
from speclens.runs.sweep_file import load_sweep_file
from speclens.sim.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "old, new, where, hint",
    [("    command: >-", "    comand: >-", "engines[0]: the key at line 9, column 5", "command"),
     ("\naxes:", "\naxis:", "(document): the key at line 16, column 1", "axes")],
)  # fmt: skip
def test_a_sweep_files_typo_names_the_nearest_key(
    tmp_path: Path, old: str, new: str, where: str, hint: str
) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text((EXAMPLES / "sweep-speclens-k.yaml").read_text().replace(old, new, 1))
    with pytest.raises(ValidationError) as caught:
        load_sweep_file(path)
    lines = [str(p) for p in caught.value.problems]
    assert f"{path}: {where} is not a recognized key; did you mean {hint!r}?" in lines, lines
    assert all(new.strip().rstrip(":>- ") not in line for line in lines)  # never the key's text


def test_a_key_near_nothing_gets_no_hint(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    text = (EXAMPLES / "kimi-k3-dspark.yaml").read_text()
    path.write_text(text.replace("hardware: b300", "hardware: b300\nzzqqxx: 1", 1))
    with pytest.raises(ValidationError) as caught:
        load_scenario(path)
    (line,) = [str(p) for p in caught.value.problems]
    assert "is not a recognized key" in line and "did you mean" not in line
