"""Small helpers every command shares: error reporting and the registry option."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from speclens.acceptance import Registry, ResolutionRefused, ValidationError

# Wide when piped or captured, so tables of long names and URLs are not cut to 80 columns.
err_console = Console(stderr=True, soft_wrap=True, highlight=False)
out_console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

REGISTRY_OPTION = typer.Option(
    [],
    "--registry",
    help="A registry directory (holding acceptance/<name>.yaml) to add to the shipped one. Repeatable.",
    exists=True,
    file_okay=False,
    dir_okay=True,
)


def fail(lines: Iterable[str] | str, code: int = 1) -> NoReturn:
    """Print each line to stderr and exit with ``code`` (1: invalid input or refusal)."""
    for line in [lines] if isinstance(lines, str) else lines:
        err_console.print(line, markup=False)
    raise typer.Exit(code)


def load_registry(extra: list[Path]) -> Registry:
    return Registry.load(extra=extra)


@contextmanager
def reported() -> Iterator[None]:
    """Turn speclens's errors into their one-line-per-problem report and exit 1."""
    try:
        yield
    except ValidationError as exc:
        fail(str(p) for p in exc.problems)
    except ResolutionRefused as exc:
        fail(f"refused: {exc}")
