"""The ``speclens`` command: one module per command group, thin over the library.

Ctrl-C anywhere, even while these imports are still running, exits 130 without a traceback.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C

try:
    import logging

    import typer

    from speclens import __version__
    from speclens.cli import bench, calibrate, demo, export, lossless, measure, profiles, serve, sim
    from speclens.cli import compare as compare_cli
    from speclens.cli import importing as import_cli
    from speclens.cli import report as report_cli
    from speclens.cli import sweep as sweep_cli
    from speclens.cli._fanout import RayCommand
    from speclens.cli._help import HELP_WIDTH, HelpGroup
except KeyboardInterrupt:  # the console script imports this module before main() runs
    raise SystemExit(INTERRUPTED) from None

app = typer.Typer(
    name="speclens",
    help="State, force, measure and predict speculative-decoding acceptance length.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=HelpGroup,  # help that reads at 80 columns (speclens.cli._help)
    context_settings={"max_content_width": HELP_WIDTH},
)
app.add_typer(profiles.app, name="profiles")
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.add_typer(bench.app, name="bench")
app.command("measure")(measure.measure)
app.command("sim", cls=RayCommand)(sim.sim)  # --ray [ADDRESS]
app.command("export")(export.export)
app.command("lossless")(lossless.lossless)
app.command("sweep")(sweep_cli.sweep)
app.command("compare")(compare_cli.compare)
app.command("report")(report_cli.report)
app.command("calibrate", cls=RayCommand)(calibrate.calibrate)
app.add_typer(import_cli.app, name="import")


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
    """Console-script entry point. Typer turns a Ctrl-C inside a command into exit 130; this
    covers the moments around it (building the command, interpreter teardown of ``app``)."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
