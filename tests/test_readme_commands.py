"""Every `speclens ...` command the documents show still parses.

Each fenced code block line of README.md and docs/*.md that runs ``speclens`` (``$ speclens``
in a transcript; ``\\`` continuations joined, comments and what follows ``&``, ``|`` or ``;``
dropped, shell variables read as ``1``) is parsed by the real command line: the subcommand is
resolved level by level and each level's context is made from its arguments, so an unknown
subcommand or option, a missing or extra positional argument, a missing required option and a
value outside an option's choices or type all fail. Then the same argv with ``--help`` appended
must print its help. The cheap ones (``profiles resolve``: it only reads the registry) are run,
and the output the document shows under them is checked against what they print. Every
relative link in the documents names a file that exists, and a heading in it after ``#``.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from speclens.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Shell syntax that ends the speclens command on a line.
SHELL_ENDS = {"&", "&&", "|", "||", ";", ">", ">>", "2>", "2>&1"}
MISSING_FILE = re.compile(r"'([^']+)' does not exist")


@dataclass(frozen=True)
class Shown:
    """One command a document shows, and the comment lines right under it."""

    where: str  # document:line
    argv: list[str]
    comments: list[str]


def _argv(command: str) -> list[str]:
    command = re.sub(r"\$\(\(.*?\)\)", "1", command)  # $((c == 1 ? 12 : 8 * c))
    command = re.sub(r"\$\{?\w+\}?", "1", command)  # $p, ${p}
    tokens = shlex.split(command, comments=True)
    for i, token in enumerate(tokens):
        if token in SHELL_ENDS:
            return tokens[:i]
    return tokens


def shown_commands(path: Path) -> list[Shown]:
    """The ``speclens`` commands in ``path``'s fenced code blocks, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Shown] = []
    in_fence = False
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if text.startswith("```"):
            in_fence = not in_fence
        elif in_fence:
            text = text.removeprefix("$ ")
            if text == "speclens" or text.startswith("speclens "):
                start = i
                parts = [text]
                while parts[-1].endswith("\\") and i + 1 < len(lines):
                    parts[-1] = parts[-1][:-1]
                    i += 1
                    parts.append(lines[i].strip())
                comments = []
                while i + 1 < len(lines) and lines[i + 1].strip().startswith("#"):
                    i += 1
                    comments.append(lines[i].strip())
                found.append(
                    Shown(f"{path.relative_to(ROOT)}:{start + 1}", _argv(" ".join(parts)), comments)
                )
        i += 1
    return found


SHOWN = [shown for path in DOCUMENTS for shown in shown_commands(path)]


@functools.cache
def _cli() -> Any:
    """The ``speclens`` command as click sees it (built once: building it takes 30 ms)."""
    return typer.main.get_command(app)


def test_the_documents_show_commands() -> None:
    """The extraction finds the tour: every top-level command appears in README.md at least."""
    readme = {shown.argv[1] for shown in SHOWN if shown.where.startswith("README.md")}
    commands = set(_cli().commands)
    assert commands <= readme, f"README.md shows no example of {sorted(commands - readme)}"


def _parse(argv: list[str]) -> list[str]:
    """Parse ``argv`` (without ``speclens``) level by level as the CLI would; the names of the
    subcommands resolved. Raises the command line's own error for anything it would refuse."""
    command = _cli()
    ctx = command.make_context("speclens", list(argv))
    path: list[str] = []
    while hasattr(command, "commands"):
        # the subcommand's name and its arguments, as the group's parser left them
        protected = getattr(ctx, "_protected_args", None)
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        if not rest:
            assert command.invoke_without_command, f"{' '.join(path)}: needs a subcommand"
            break
        name, command, rest = command.resolve_command(ctx, rest)
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return path


def _parse_with_files(argv: list[str], workdir: Path) -> list[str]:
    """``_parse``, where a file the command must find (a prompt file, a run) is made empty in
    ``workdir``; the repository's ``examples/`` are there and must hold what the documents name."""
    for _ in range(len(argv) + 1):
        try:
            return _parse(argv)
        except Exception as error:
            missing = MISSING_FILE.search(str(error))
            if missing is None or missing[1].startswith("examples/"):
                raise
            (workdir / missing[1]).parent.mkdir(parents=True, exist_ok=True)
            (workdir / missing[1]).touch()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("shown", SHOWN, ids=[shown.where for shown in SHOWN])
def test_shown_command_parses(
    shown: Shown,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert shown.argv[0] == "speclens"
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    try:
        path = _parse_with_files(shown.argv[1:], tmp_path)
    except Exception as error:
        pytest.fail(f"{shown.where}: `{shlex.join(shown.argv)}` does not parse: {error}")
    assert path, f"{shown.where}: no subcommand"
    code = _cli().main([*shown.argv[1:], "--help"], prog_name="speclens", standalone_mode=False)
    output = capsys.readouterr().out
    assert code == 0, f"{shown.where}: --help exits {code}: {output}"
    assert f"Usage: speclens {' '.join(path)}" in output


RESOLVES = [shown for shown in SHOWN if shown.argv[1:3] == ["profiles", "resolve"]]


def _expected_fields(comment: str) -> dict[str, Any]:
    """The ``"key": value`` pairs a ``# {...}`` comment shows (it may elide others with ...)."""
    pairs = re.findall(r'"(\w+)": (\[[^\]]*\]|"[^"]*"|-?[\d.]+|true|false|null)', comment)
    return {key: json.loads(value) for key, value in pairs}


@pytest.mark.parametrize("shown", RESOLVES, ids=[shown.where for shown in RESOLVES])
def test_shown_resolve_prints_what_the_document_says(shown: Shown) -> None:
    """``profiles resolve`` is cheap: run it, and each ``--emit`` the comments show."""
    assert shown.comments, f"{shown.where}: shows no output"
    result = CliRunner().invoke(app, shown.argv[1:])
    assert result.exit_code == 0, f"{shown.where}: exit {result.exit_code}: {result.output}"
    first = shown.comments[0].removeprefix("#").strip()
    if "--json" in shown.argv:
        expected = _expected_fields(first)
        assert expected, f"{shown.where}: no fields in {first!r}"
        printed = json.loads(result.stdout)
        assert {key: printed[key] for key in expected} == expected
    else:
        assert result.stdout.strip() == first
    emit = shown.argv.index("--emit") if "--emit" in shown.argv else None
    for comment in shown.comments[1:]:
        other = re.match(r"#\s+--emit (\w+)\s+->\s+(.*?)(\s{2,}\(.*\))?$", comment)
        if other is None or emit is None:
            continue
        argv = shown.argv[1:]
        argv[emit] = other[1]  # --emit's value: shown.argv[emit + 1] is argv[emit]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, f"{shown.where}: --emit {other[1]}: {result.output}"
        assert result.stdout.strip() == other[2], f"{shown.where}: --emit {other[1]}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives ``path``'s headings (lower case, punctuation dropped)."""
    anchors: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (heading := re.match(r"#{1,6} (.*)", line)):
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.name for p in DOCUMENTS])
def test_relative_links_resolve(path: Path) -> None:
    """Every relative link names a file that exists and, after ``#``, one of its headings."""
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)
