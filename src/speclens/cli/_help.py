"""``--help`` that reads at 80 columns.

Typer's Rich panels put an option, its ``--no-`` form and its type in columns of their own and
leave the description what is left: 20 columns at 80. Help is instead laid out the classic way
(click's definition list: the option, then its description at column 34, or on the next line when
the option is long), at the terminal's width capped at ``HELP_WIDTH`` so lines stay readable on a
wide terminal. Metavars name the value (``N``, ``X``, ``FILE``, ``DIR``, ``URL``), flags take none.
Only help changes: usage errors keep their Rich panel (the root command's ``main`` renders them).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any

import typer.core
from typer import _click

HELP_WIDTH = 100  # the widest help a wide terminal gets
NARROW = 80  # help fits this many columns


def _commands(command: _click.Command) -> Iterator[_click.Command]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def _word(option: typer.core.TyperOption) -> str:
    """The option's last word, upper case: ``--output-dir`` -> ``DIR``, ``--model`` -> ``MODEL``."""
    long = [o for o in option.opts if o.startswith("--")] or list(option.opts)
    return long[0].lstrip("-").split("-")[-1].upper() or "VALUE"


def metavar(option: typer.core.TyperOption) -> str | None:
    """A short metavar for ``option`` from its type (None: leave it as it is)."""
    described = getattr(option, "type_descriptor", None)
    if described is None:
        return None
    choices = described.choices
    if choices is not None:
        values = [str(getattr(c, "value", c)) for c in choices]
        return "[" + "|".join(values) + "]"
    annotation = described.annotation
    if described.is_list:
        annotation = (getattr(annotation, "__args__", None) or (str,))[0]
    if described.is_path or (isinstance(annotation, type) and issubclass(annotation, PurePath)):
        info = described.parameter_info
        if not info.dir_okay:
            return "FILE"
        return "DIR" if not info.file_okay else "PATH"
    if annotation is int:
        return "N"
    if annotation is float:
        return "X"
    return _word(option)


def _tidy(command: _click.Command) -> None:
    if command.short_help is None and command.help:
        # a group's list shows each command's first paragraph whole, wrapped, not cut at "..."
        command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
    for param in command.params:
        if not isinstance(param, typer.core.TyperOption) or param.metavar is not None:
            continue
        if param.is_flag or param.count:
            continue  # a flag shows no metavar in this layout
        param.metavar = metavar(param)
        names = ", ".join(param.opts) + (
            " / " + ", ".join(param.secondary_opts) if param.secondary_opts else ""
        )
        if (
            param.metavar
            and param.metavar.startswith("[")
            and len(f"  {names} {param.metavar}") > NARROW - 2
        ):
            # too long beside the names: the choices move into the description
            choices = param.metavar[1:-1].replace("|", ", ")
            said = (param.help or "").rstrip()
            param.help = (
                f"{said} One of: {choices}."
                if said.endswith(".")
                else f"{said} (one of {choices})".strip()
            )
            param.metavar = _word(param)
    if isinstance(command, (typer.core.TyperCommand, typer.core.TyperGroup)):
        command.rich_markup_mode = None  # click's layout for this command's help


class HelpGroup(typer.core.TyperGroup):
    """The ``speclens`` group: every command under it gets the help described above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        errors = self.rich_markup_mode  # usage errors are rendered by this command's main
        for command in _commands(self):
            _tidy(command)
        self.rich_markup_mode = errors

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _click.Command.format_help(self, ctx, formatter)
