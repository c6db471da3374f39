"""``--ray [ADDRESS]``: a command's independent simulations as Ray tasks (``speclens.sim.fanout``).

``--ray`` alone starts a local Ray for the run; ``--ray ADDRESS`` joins the cluster there. Typer
options always take a value, so a command with ``--ray`` is a ``RayCommand``: before parsing, it
reads the word after ``--ray`` as its ADDRESS only where it reads as one (``HOST:PORT``,
``ray://...``, ``auto``, ``local``), and otherwise gives ``--ray`` the value ``local``; a scenario
or run directory after ``--ray`` stays the argument it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
import typer.core
from typer import _click

from speclens.cli._common import fail
from speclens.sim import fanout

RAY_OPTION = typer.Option(
    None,
    "--ray",
    metavar="[ADDRESS]",
    help="Run the simulations as Ray tasks: alone, on a local Ray started for the run "
    f"(--jobs CPUs); with HOST:PORT, ray://HOST:PORT or auto, on that cluster "
    f"({fanout.INSTALL}).",
)


def reads_as_address(word: str) -> bool:
    """Whether the word after ``--ray`` is its ADDRESS (else ``--ray`` stands alone)."""
    if word.startswith("-"):
        return False
    return word == fanout.LOCAL or "://" in word or fanout.ADDRESS.fullmatch(word) is not None


def optional_ray(args: list[str]) -> list[str]:
    """``args`` with each ``--ray`` given its value: the next word where it reads as an
    address, else ``local``; nothing after ``--`` changes."""
    out: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out.extend(args[i:])
            break
        if word == "--ray":
            after = args[i + 1] if i + 1 < len(args) else None
            if after is not None and reads_as_address(after):
                out.append(f"--ray={after}")
                i += 2
                continue
            out.append(f"--ray={fanout.LOCAL}")
        else:
            out.append(word)
        i += 1
    return out


class RayCommand(typer.core.TyperCommand):
    """A command whose ``--ray`` takes an optional ADDRESS (see the module)."""

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        parsed: list[str] = super().parse_args(ctx, optional_ray(list(args)))
        return parsed


def ray_address(value: str | None) -> str | None:
    """``--ray``'s address, checked before any work: exit 2 for one that is not an address,
    or where Ray is not installed (one line: how to install it)."""
    if value is None:
        return None
    problem = fanout.address_problem(value)
    if problem:
        fail(f"command line: --ray: {problem}", code=2)
    try:
        fanout.require_ray()
    except fanout.FanoutError as exc:
        fail(f"command line: --ray: {exc}", code=2)
    return value


@contextmanager
def ray_reported() -> Iterator[None]:
    """A Ray that cannot start, or a cluster that cannot be joined: one line and exit 1."""
    try:
        yield
    except fanout.FanoutError as exc:
        fail(f"command line: --ray: {exc}")
