"""Every command's ``--help`` reads at 80 columns: no line is wider, and each option's description
starts early enough to keep at least 35 columns for its words; a wide terminal gets at most 100."""

from __future__ import annotations

import re

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from speclens.cli import app

NARROW, WIDEST, DESCRIPTION = 80, 100, 35


def _commands() -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        found.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(get_command(app), ())
    return found


def _command(path: tuple[str, ...]) -> typer.core.TyperCommand:
    command = get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]


def _help(path: tuple[str, ...], columns: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


COMMANDS = _commands()


def test_the_walk_finds_the_command_tree() -> None:
    assert ("sim",) in COMMANDS and ("bench", "merge") in COMMANDS and len(COMMANDS) > 15


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "speclens")
def test_help_fits_80_columns_with_room_for_descriptions(path: tuple[str, ...]) -> None:
    text = _help(path, NARROW)
    lines = text.splitlines()
    wide = [line for line in lines if len(line) > NARROW]
    assert not wide, f"lines over {NARROW} columns:\n" + "\n".join(wide)
    for param in _command(path).params:
        if getattr(param, "hidden", False) or not getattr(param, "help", None):
            continue
        long_names = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
        if not long_names:
            continue
        opening = " ".join(str(param.help).split()[:2])
        name = re.compile(rf"^[\s│]*(-\w+, )?{re.escape(long_names[0])}([\s,/]|$)")
        at = [i for i, line in enumerate(lines) if name.match(line)]
        assert at, f"{long_names[0]} is not in the help of {' '.join(path)}"
        window = lines[at[0] : at[0] + 2]
        columns = [line.find(opening) for line in window if opening in line]
        assert columns, f"{long_names[0]}'s description {opening!r} is not beside or under it"
        assert columns[0] <= NARROW - DESCRIPTION, (
            f"{long_names[0]}'s description starts at column {columns[0]}, leaving fewer than "
            f"{DESCRIPTION} columns:\n" + "\n".join(window)
        )


@pytest.mark.parametrize("path", [(), ("sim",), ("bench",)], ids=["speclens", "sim", "bench"])
def test_a_wide_terminal_gets_readable_lines(path: tuple[str, ...]) -> None:
    lines = _help(path, 200).splitlines()
    assert max(len(line) for line in lines) <= WIDEST


def test_metavars_name_the_value_and_flags_take_none() -> None:
    bench, sim = _help(("bench",), NARROW), _help(("sim",), NARROW)
    for text in (bench, sim):
        assert "<list[" not in text and "<bool>" not in text and "<int>" not in text
    assert "--url URL " in bench and "--workers N " in bench and "--burstiness X " in bench
    assert "--registry DIR " in sim  # a list of directories: one DIR, repeated
    assert re.search(r"^  --json +Print", sim, re.MULTILINE)  # a flag takes no value
