"""Small helpers every command shares: error reporting and the registry option."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from speclens.acceptance import (
    MAX_NUM_SPEC_TOKENS,
    AcceptanceValue,
    Problem,
    Registry,
    ResolutionRefused,
    ValidationError,
    validate,
)
from speclens.acceptance.quantity import num_spec_tokens_problem

# Wide when piped or captured, so tables of long names and URLs are not cut to 80 columns.
err_console = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)  # ":x:" stays
out_console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

REGISTRY_OPTION = typer.Option(
    [],
    "--registry",
    help="A registry directory (holding acceptance/<name>.yaml) to add to the shipped one. Repeatable.",
    exists=True,
    file_okay=False,
    dir_okay=True,
)


def num_spec_tokens_callback(value: int | None) -> int | None:
    """A K option's check (``typer.Option(..., callback=num_spec_tokens_callback)``): a K outside
    [1, MAX_NUM_SPEC_TOKENS] is the command's usage error (exit 2), before any work sizes by it."""
    problem = None if value is None else num_spec_tokens_problem(value)
    if problem:
        raise typer.BadParameter(f"K {problem} (K is in [1, {MAX_NUM_SPEC_TOKENS}])")
    return value


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


ACCEPTANCE_LENGTH_OPTION = typer.Option(
    None, "--acceptance-length", help="State the AL (cli layer)."
)
ACCEPTANCE_RATE_OPTION = typer.Option(
    None, "--acceptance-rate", help="State the acceptance rate (cli layer)."
)
PER_POSITION_RATES_OPTION = typer.Option(
    None, "--per-position-rates", help="State rates R1,R2,... (cli layer)."
)


def cli_value(
    k: int, length: float | None, rate: float | None, rates: str | None
) -> AcceptanceValue | None:
    """The command line's acceptance value at K (None when no flag states one)."""
    data: dict[str, Any] = {"num_spec_tokens": k}
    if length is not None:
        data["acceptance_length"] = length
    if rate is not None:
        data["acceptance_rate"] = rate
    if rates is not None:
        try:
            data["per_position_rates"] = [float(r) for r in rates.split(",") if r.strip()]
        except ValueError:
            raise ValidationError(
                [
                    Problem(
                        "command line",
                        "--per-position-rates",
                        f"expected numbers separated by commas, got {rates!r}",
                    )
                ]
            ) from None
    if len(data) == 1:
        return None
    flags = {
        "acceptance_length": "--acceptance-length",
        "acceptance_rate": "--acceptance-rate",
        "per_position_rates": "--per-position-rates",
    }
    data["source"] = "command line " + " ".join(flags[f] for f in flags if f in data)
    return validate(AcceptanceValue, data, "command line")


@contextmanager
def interrupt_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then raise it: a KeyboardInterrupt raised while torch's
    native extension is importing escapes as a C++ exception and aborts the process (SIGABRT)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if caught:
        raise KeyboardInterrupt


def seconds(value: float) -> str:
    """A duration in the unit that reads it (3 significant digits): s, ms, us or ns."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns" if value else "0 s"
