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
import yaml

import launch
from childtime import Took, assert_quick, took
from speclens.acceptance import AcceptanceProfileSet, shipped_registry
from speclens.acceptance.errors import ValidationError
from speclens.acceptance.files import parse_yaml

#: A refusal's own work must fit in this, beyond the child's start-up (``childtime``).
QUICK_MARGIN_S = 1.5


def speclens(*args: str | Path, timeout: float = 30) -> tuple[int, list[str], Took]:
    """Run ``speclens`` in a child; (exit code, stderr lines, how long it took). A child still
    running at ``timeout`` fails the test."""
    start = time.monotonic()
    try:
        done = launch.run(
            [sys.executable, "-m", "speclens", *map(str, args)],
            timeout=timeout,
            env={**os.environ, "COLUMNS": "80"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"speclens {' '.join(map(str, args))} still running after {timeout} s")
    return done.returncode, done.stderr.splitlines(), took(done, time.monotonic() - start)


def assert_refused(args: tuple[str | Path, ...], file: Path, where: str, phrase: str) -> None:
    code, lines, elapsed = speclens(*args)
    assert code == 1, lines[-5:]
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"{file}: {where}"), lines[0]
    assert phrase in lines[0], lines[0]
    assert_quick(elapsed, QUICK_MARGIN_S)


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
    assert_quick(elapsed, QUICK_MARGIN_S)


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
        "import time; cpu = time.process_time()\n"
        "try: validate(AcceptanceProfileSet, data, 'mem')\n"
        "except ValidationError as exc: words = str(exc).split(); problems = len(exc.problems)\n"
        "print(problems, max(map(len, words)), time.process_time() - cpu)\n"
    )
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("validation still running after 30 s")
    assert done.returncode == 0, done.stderr[-2000:]
    problems, longest_word, cpu_s = done.stdout.split()
    assert int(problems) == 18  # caveats[0..8] and profiles[0..8]: each a list, not a string/map
    assert int(longest_word) < 100
    assert_quick(Took(time.monotonic() - start, float(cpu_s)), QUICK_MARGIN_S)


# --------------------------------------------------------------------------- K out of bounds
#: A set whose one profile has K = {k}: everything else about it is valid.
K_SET = """kind: AcceptanceProfileSet
name: big-k
profiles:
  - model: m
    speculative_method: mtp
    num_spec_tokens: {k}
    thinking: "on"
    category: coding
    acceptance_length: 1.5
    method: assumed
    rationale: a K nobody runs
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", ["1e20", str(10**20), str(10**9), "65", "0", "9" * 5000, "٤"])
def test_resolve_refuses_an_impossible_k_as_a_usage_error(run_cli, k: str) -> None:
    """``-k 1e20`` used to be an OverflowError traceback and ``-k 10**9`` a MemoryError; a K
    outside [1, 64] is now the option's usage error, exit 2, before any work is sized by it."""
    args = ("profiles", "resolve", "--model", "m", "--method", "mtp", "-k", k)
    code, out, err = run_cli(*args, "--acceptance-length", "2")
    assert code == 2, (out, err)
    assert "--num-spec-tokens" in err and "Traceback" not in err + out, err
    if k.isascii() and k.isdigit() and len(k) < 30:
        assert "64" in err, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [65, 10**9, 10**20])
def test_a_profile_set_with_k_past_the_bound_is_invalid(run_cli, tmp_path: Path, k: int) -> None:
    """``validate`` used to say ok to K = 10**20 (what import-inferencex wrote)."""
    file = tmp_path / "big-k.yaml"
    file.write_text(K_SET.format(k=k))
    code, out, err = run_cli("profiles", "validate", file)
    assert code == 1 and "ok" not in out, out
    assert err.splitlines() == [f"{file}: profiles[0].num_spec_tokens: must be at most 64, got {k}"]


def test_every_k_field_is_bounded() -> None:
    from speclens.acceptance import AcceptanceValue, ProfileKey, validate

    with pytest.raises(ValidationError, match="num_spec_tokens: must be at most 64"):
        validate(AcceptanceValue, {"num_spec_tokens": 10**9, "acceptance_length": 2.0}, "s")
    with pytest.raises(ValueError, match="must be at most 64"):
        ProfileKey(
            model="m", speculative_method="x", num_spec_tokens=65, thinking="on", category="c"
        )
    data = yaml.safe_load(K_SET.format(k=3))
    data["profiles"][0].update(method="copied", copied_from="m/mtp/k100/thinking-on/coding")
    with pytest.raises(ValidationError, match="copied_from: names K 100: K must be at most 64"):
        validate(AcceptanceProfileSet, data, "s")


@pytest.mark.timeout(60)
def test_a_million_per_position_rates_are_refused_by_their_count() -> None:
    from speclens.acceptance import AcceptanceValue, validate

    value = {"num_spec_tokens": 3, "per_position_rates": [0.5] * 1_000_000}
    cpu = time.process_time()
    with pytest.raises(ValidationError) as caught:
        validate(AcceptanceValue, value, "s")
    cpu_s = time.process_time() - cpu  # this process's threads: the xdist worker's own work
    (problem,) = caught.value.problems
    assert problem.path == "per_position_rates"
    assert "has 1,000,000 entries, over the limit of 64" in problem.message
    assert cpu_s < QUICK_MARGIN_S, cpu_s


def test_the_schema_states_the_k_bound() -> None:
    schema = AcceptanceProfileSet.model_json_schema()
    profile = schema["$defs"]["Profile"]["properties"]
    assert profile["num_spec_tokens"]["maximum"] == 64
    assert profile["per_position_rates"]["anyOf"][0]["maxItems"] == 64


# --------------------------------------------------------------------------- import-inferencex keys
def _import(run_cli, tmp_path: Path, text: str) -> tuple[int, str, Path]:
    src = tmp_path / "curves.yaml"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "set.yaml"
    args = ("profiles", "import-inferencex", src, "--speculative-method", "mtp", "-o", out)
    code, _, err = run_cli(*args, "--method", "assumed", "--rationale", "r")
    return code, err, out


@pytest.mark.parametrize(
    "curve",
    [
        pytest.param('{"1": 1.5, "01": 1.6}', id="1-and-01"),
        pytest.param("{01: 1.6}", id="plain-01"),
        pytest.param('{" 2": 2.0, "+2": 2.1}', id="space-2-and-plus-2"),
        pytest.param("{+2: 2.1}", id="plain-plus-2"),
        pytest.param('{2: 2.0, "\u0662": 2.1}', id="arabic-indic-2"),
        pytest.param('{1: 1.5, "1": 1.6}', id="int-and-string-1"),
        pytest.param("{0x4: 2.0}", id="hex-4"),
        pytest.param("{1_0: 2.0}", id="underscore-10"),
        pytest.param(f"{{{10**20}: 2.0}}", id="k-10-to-the-20"),
        pytest.param("{65: 2.0}", id="k-65"),
    ],
)
def test_import_refuses_a_k_key_that_is_not_one_plain_decimal(
    run_cli, tmp_path: Path, curve: str
) -> None:
    """Every one of these used to be read as some K, the last spelling silently kept (or
    K = 10**20 written out as a valid set)."""
    code, err, out = _import(run_cli, tmp_path, f"m:\n  thinking_on: {curve}\n")
    assert code == 1, err
    assert not out.exists()
    assert "m.thinking_on" in err, err
    assert any(
        phrase in err
        for phrase in ("plain decimal integer", "is given twice", "must be at most 64")
    ), err


def test_import_refuses_a_json_duplicate_k(run_cli, tmp_path: Path) -> None:
    code, err, out = _import(run_cli, tmp_path, '{"m": {"thinking_on": {"1": 1.5, "1": 1.6}}}')
    assert code == 1 and not out.exists()
    assert "line 1" in err and "repeats the key at line 1" in err, err


def test_import_keeps_plain_decimal_keys_quoted_or_not(run_cli, tmp_path: Path) -> None:
    code, err, out = _import(run_cli, tmp_path, 'm:\n  thinking_on: {1: 1.5, "2": 2.0, 10: 2.5}\n')
    assert code == 0, err
    ks = [p["num_spec_tokens"] for p in yaml.safe_load(out.read_text())["profiles"]]
    assert ks == [1, 2, 10]
