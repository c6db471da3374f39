"""``speclens sweep`` under bad input: every refusal is one line naming the file or flag, the
field and what was expected, exit 2, before any server starts or request is sent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speclens.cli import app

PY = sys.executable
GOOD = f"{PY} -m speclens serve --executor sim --port {{port}} {{forcing}}"


def sweep(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["sweep", "--model", "dummy", "--output-dir", str(tmp_path / "out"), *args]
    )
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    return result.exit_code, result.output


def sweep_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def engine(command: str, extra: str = "", axes: str = "num_speculative_tokens: [2]") -> str:
    return (
        f"engines:\n  - name: speclens\n    command: '{command}'\n    emit: vllm\n"
        f"    method: draft_model\n{extra}axes:\n  {axes}\n  acceptance_length: [2.0]\n"
    )


def refused(tmp_path: Path, text: str, *args: str) -> list[str]:
    code, out = sweep(tmp_path, "--sweep-file", str(sweep_file(tmp_path, text)), *args)
    assert code == 2, out
    assert "Traceback" not in out
    assert not (tmp_path / "out" / "sweep.json").exists()  # nothing ran
    return [line for line in out.splitlines() if line.strip()]


def test_an_unknown_placeholder_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, engine(f"{PY} -m speclens serve --port {{port}} -k {{kk}}"))
    assert "sweep.yaml: engines[0].command (line 3): unknown placeholder {kk}" in line
    assert "expected {port}, {k}, {al}, {forcing}" in line


def test_a_command_that_is_not_found(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, engine("no-such-server-program --port {port}"))
    assert "program 'no-such-server-program' is not found" in line and "sweep.yaml" in line


def test_a_k_out_of_range_names_the_axis(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, engine(GOOD, axes="num_speculative_tokens: [2, 65]"))
    assert "axes.num_speculative_tokens[1]" in line and "K must be at most 64, got 65" in line


def test_an_al_above_k_plus_one(tmp_path: Path) -> None:
    text = engine(GOOD).replace("acceptance_length: [2.0]", "acceptance_length: [3.5]")
    (line,) = refused(tmp_path, text)
    assert "axes.acceptance_length: 3.5 is above K + 1 = 3 at K 2" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- just a list\n", "sweep.yaml: (document): expected a mapping, got list"),
        ("engines: []\n", "sweep.yaml: engines: List should have at least 1 item"),
        ("engines:\n  - name: a\n", "sweep.yaml: engines[0].command: Field required"),
        (
            engine(GOOD, "    health: health\n"),
            "engines[0].health: Value error, expected a path such as /health",
        ),
        (
            engine(GOOD, "    startup_timeout_s: -1\n"),
            "engines[0].startup_timeout_s: Value error, expected seconds in (0, 3600]",
        ),
        (
            engine(GOOD, "    colour: red\n"),
            "engines[0]: the key at line 6, column 5 is not a recognized key",
        ),
        ("engines: [\n", "sweep.yaml: line 2, column 1: invalid YAML"),
    ],
)
def test_a_malformed_sweep_file_names_the_field(tmp_path: Path, text: str, expected: str) -> None:
    lines = refused(tmp_path, text)
    assert any(expected in line for line in lines), lines


def test_a_placeholder_without_its_axis(tmp_path: Path) -> None:
    text = engine(f"{PY} -m speclens serve --port {{port}} --x {{al}}").replace(
        "  acceptance_length: [2.0]\n", ""
    )
    (line,) = refused(tmp_path, text)
    assert "placeholder {al} needs an acceptance_length axis or an acceptance_profile" in line


def test_a_template_without_port(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, engine(f"{PY} -m speclens serve {{forcing}}"))
    assert "expected the placeholder {port}" in line


def test_unbalanced_braces(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, engine(f"{PY} -m speclens serve --port {{port}} }}"))
    assert "engines[0].command (line 3): Single '}' encountered" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--concurrency", "1,x"],
            "command line: --concurrency: expected distinct integers >= 1 separated by commas, got '1,x'",
        ),
        (["--concurrency", "2,2"], "command line: --concurrency: expected distinct integers"),
        (["--request-rate", "0,2"], "command line: --request-rate: expected distinct numbers > 0"),
        (["--rounds", "0"], "command line: --rounds: expected an integer in [1, 100], got 0"),
        (
            ["--concurrency", "1", "--request-rate", "2"],
            "give --concurrency or --request-rate, not both",
        ),
        (
            ["--write-profile", "p.yaml"],
            "command line: --write-profile: expected --sweep-file with one engine",
        ),
    ],
)
def test_bad_flags_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    code, out = sweep(tmp_path, *args)
    assert code == 2 and expected in out, out
    assert "Traceback" not in out


def test_write_profile_needs_natural_acceptance(tmp_path: Path) -> None:
    lines = refused(tmp_path, engine(GOOD), "--write-profile", str(tmp_path / "p.yaml"))
    assert lines == [
        "command line: --write-profile: expected natural acceptance (no acceptance_length or "
        "acceptance_profile axis)"
    ]


def test_a_forcing_line_the_engine_cannot_express(tmp_path: Path) -> None:
    text = engine(GOOD).replace("emit: vllm", "emit: trtllm").replace("[2.0]", "[1.0]")
    (line,) = refused(tmp_path, text)
    assert "{forcing} at K 2: trtllm: AL 1 is TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=0" in line
