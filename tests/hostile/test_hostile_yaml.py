"""Hostile YAML: files that used to hang, overflow the stack or take a minute are refused at once,
one line naming the file, exit 1. Each case runs ``speclens`` in a child process with a timeout,
so a regression fails the test instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speclens.acceptance import shipped_registry
from speclens.acceptance.errors import ValidationError
from speclens.acceptance.files import parse_yaml

#: A refusal must come well under this, child start-up (about 0.4 s) included.
QUICK_S = 2.0


def speclens(*args: str | Path, timeout: float = 30) -> tuple[int, list[str], float]:
    """Run ``speclens`` in a child; (exit code, stderr lines, seconds). A child still running
    at ``timeout`` is killed and reported as exit code None."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "speclens", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "80"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"speclens {' '.join(map(str, args))} still running after {timeout} s")
    return done.returncode, done.stderr.splitlines(), time.monotonic() - start


def assert_refused(args: tuple[str | Path, ...], file: Path, where: str, phrase: str) -> None:
    code, lines, elapsed = speclens(*args)
    assert code == 1, lines[-5:]
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"{file}: {where}"), lines[0]
    assert phrase in lines[0], lines[0]
    assert elapsed < QUICK_S, f"took {elapsed:.1f} s"


def alias_bomb() -> str:
    """770 bytes: ten levels of anchors, each a list of nine aliases of the one below (9**9
    strings once expanded), used as a profile set's caveats."""
    levels = ['  a0: &a0 ["lol"]']
    levels += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(
        ["x-anchors:", *levels, "kind: AcceptanceProfileSet", "name: bomb", "caveats: *a9", ""]
    )


def registry_with(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A registry directory and the path of its ``acceptance/<name>``."""
    folder = tmp_path / "reg" / "acceptance"
    folder.mkdir(parents=True)
    return tmp_path / "reg", folder / name


@pytest.mark.timeout(60)
def test_alias_bomb_is_refused_by_validate(tmp_path: Path) -> None:
    file = tmp_path / "bomb.yaml"
    file.write_text(alias_bomb())
    assert len(alias_bomb()) < 1000
    assert_refused(("profiles", "validate", file), file, "line ", "100,000 nodes")


@pytest.mark.timeout(60)
def test_alias_bomb_in_a_registry_is_refused_by_list(tmp_path: Path) -> None:
    registry, file = registry_with(tmp_path, "bomb.yaml")
    file.write_text(alias_bomb())
    assert_refused(("profiles", "list", "--registry", registry), file, "line ", "100,000 nodes")


@pytest.mark.timeout(60)
def test_a_100000_deep_list_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "deep.yaml"
    file.write_text("[" * 100_000 + "]" * 100_000)
    # libyaml stops at its own limit (1,000 levels), the pure-Python parser at ours (64).
    code, lines, elapsed = speclens("profiles", "validate", file)
    assert code == 1, lines[-5:]
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"{file}: line 1, column "), lines[0]
    assert "nest" in lines[0], lines[0]
    assert elapsed < QUICK_S, f"took {elapsed:.1f} s"


@pytest.mark.timeout(60)
def test_a_3000_deep_mapping_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "deep.yaml"
    file.write_text("{k: " * 3000 + "1" + "}" * 3000)
    assert_refused(("profiles", "validate", file), file, "line 1, column 257: ", "deeper than 64")


@pytest.mark.timeout(60)
def test_a_fifo_in_a_registry_is_refused_not_waited_on(tmp_path: Path) -> None:
    registry, fifo = registry_with(tmp_path, "x.yaml")
    os.mkfifo(fifo)
    for args in (("profiles", "validate", registry), ("profiles", "list", "--registry", registry)):
        assert_refused(args, fifo, "(file): ", "is not a regular file (a FIFO)")


@pytest.mark.timeout(120)
def test_an_oversize_file_is_refused_by_size_before_parsing(tmp_path: Path) -> None:
    file = tmp_path / "big.yaml"
    line = "- a caveat that is long enough to make this file big quickly\n"
    file.write_text("kind: AcceptanceProfileSet\nname: big\ncaveats:\n" + line * 90_000)
    assert file.stat().st_size > 4 * 2**20  # files.MAX_FILE_BYTES
    assert_refused(("profiles", "validate", file), file, "(file): ", "over the 4 MiB limit")


@pytest.mark.timeout(60)
def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "cycle.yaml"
    file.write_text("kind: AcceptanceProfileSet\nname: cycle\ncaveats: &c [*c]\n")
    assert_refused(("profiles", "validate", file), file, "line 3, column 14: ", "cycle")


@pytest.mark.timeout(60)
def test_a_long_sexagesimal_integer_is_refused(tmp_path: Path) -> None:
    # YAML 1.1 reads 1:59:59... as base 60, converted in quadratic time (minutes at 4 MiB).
    file = tmp_path / "sexagesimal.yaml"
    file.write_text("kind: AcceptanceProfileSet\nname: s\nx: 1" + ":59" * 400_000 + "\n")
    assert_refused(("profiles", "validate", file), file, "line 3, column 4: ", "integer of")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("text", "where", "phrase"),
    [
        ("when: 2024-02-30\n", "line 1, column 7", "day is out of range"),
        (f"k: {'1' * 5000}\n", "line 1, column 4", "integer of 5000 characters"),
    ],
)
def test_a_scalar_python_cannot_convert_is_a_located_problem(
    text: str, where: str, phrase: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_yaml(text, "f.yaml")
    (problem,) = caught.value.problems
    assert (problem.file, problem.path) == ("f.yaml", where)
    assert phrase in problem.message


@pytest.mark.timeout(60)
def test_the_shipped_registry_still_validates() -> None:
    code, lines, _ = speclens("profiles", "validate", shipped_registry())
    assert code == 0, lines


@pytest.mark.timeout(60)
def test_validating_a_shared_huge_structure_never_renders_it() -> None:
    # A bomb built in Python (9**8 strings through shared lists) reaches the schema's error
    # wording directly; it used to be repr()'d whole before its type was looked at.
    code = (
        "from speclens.acceptance import AcceptanceProfileSet, ValidationError, validate\n"
        "x = ['lol']\n"
        "for _ in range(8): x = [x] * 9\n"
        "data = {'kind': 'AcceptanceProfileSet', 'name': 'b', 'caveats': x, 'profiles': x}\n"
        "try: validate(AcceptanceProfileSet, data, 'mem')\n"
        "except ValidationError as exc: print(len(exc.problems), max(map(len, str(exc).split())))\n"
    )
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("validation still running after 30 s")
    assert done.returncode == 0, done.stderr[-2000:]
    problems, longest_word = map(int, done.stdout.split())
    assert problems == 18  # caveats[0..8] and profiles[0..8]: each is a list, not a string/mapping
    assert longest_word < 100
    assert time.monotonic() - start < QUICK_S
