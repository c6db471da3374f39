"""compare's tables are headed by the inputs' names: the directory names by default, A, B, ...
only where those repeat or cannot be read as a label, the user's ``--label`` always."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclens.acceptance import ValidationError
from speclens.runs.compare_inputs import MAX_DEFAULT_LABEL, labels_for


def test_distinct_directory_names_are_the_labels(tmp_path: Path) -> None:
    paths = [tmp_path / "b300", tmp_path / "h200", tmp_path / "sub" / "mi355x"]
    assert labels_for(3, [], paths) == ["b300", "h200", "mi355x"]


def test_a_trailing_slash_or_dot_still_names_the_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b300").mkdir()
    assert labels_for(2, [], [Path("b300/"), Path(".")]) == ["b300", tmp_path.name]


@pytest.mark.parametrize(
    "names",
    [["run", "run"], ["x" * (MAX_DEFAULT_LABEL + 1), "b"], ["a\tb", "c"], [" a", "b"]],
)
def test_names_that_repeat_or_do_not_read_as_labels_fall_back_to_letters(
    tmp_path: Path, names: list[str]
) -> None:
    paths = [tmp_path / str(i) / n for i, n in enumerate(names)]
    assert labels_for(2, [], paths) == ["A", "B"]


def test_the_users_labels_win_and_are_checked(tmp_path: Path) -> None:
    paths = [tmp_path / "b300", tmp_path / "h200"]
    assert labels_for(2, ["new", "old"], paths) == ["new", "old"]
    with pytest.raises(ValidationError):
        labels_for(2, ["same", "same"], paths)
