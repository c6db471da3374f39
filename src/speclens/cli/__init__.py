"""The ``speclens`` command: one module per command group, thin over the library."""

from __future__ import annotations

import logging

import typer

from speclens import __version__
from speclens.cli import bench, demo, measure, profiles, serve, sim

app = typer.Typer(
    name="speclens",
    help="State, force, measure and predict speculative-decoding acceptance length.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(profiles.app, name="profiles")
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("bench")(bench.bench)
app.command("measure")(measure.measure)
app.command("sim")(sim.sim)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"speclens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="Logging level for messages."),
) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s", force=True
    )


def main() -> None:
    """Console-script entry point."""
    app()
