"""``speclens calibrate RUN_DIR... -o COST.yaml``: a step cost fitted from observed runs of any
engine, from what the client saw (``speclens.sim.calibrate``): the linear cost, or with
``--model`` and ``--hardware`` the roofline's efficiencies and overhead. ``speclens calibrate
--host -o CHIP.yaml`` measures this machine as a chip entry instead (``speclens.sim.host``).
Published points with ``--acceptance-from``: ``cli.calibrate_points`` (the AL curve, and
``--write-profile``).

Exit codes: 0 written; 1 a run that cannot be read or a fit that is refused (one load point,
too few steps); 2 usage.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from speclens.cli._common import fail, out_console, seconds
from speclens.cli._fanout import RAY_OPTION, ray_address
from speclens.cli.calibrate_points import ProfileTarget, is_published, published
from speclens.cli.calibrate_points import write_yaml as _write


class Thinking(StrEnum):
    on = "on"
    off = "off"


def calibrate(
    runs: list[Path] = typer.Argument(
        None, help="Run directories (bench --output-dir) of one engine, at two load points or more."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The YAML file to write."),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Fit a roofline: the model, a catalog name or a config.json / entry "
        "file (with --hardware).",
    ),
    hardware: str | None = typer.Option(
        None,
        "--hardware",
        help="Fit a roofline: the chip, a catalog name or an entry file "
        "(calibrate --host writes one).",
    ),
    parallel: int | None = typer.Option(
        None,
        "--parallel",
        min=1,
        max=1024,
        help="Tensor-parallel size (default 1; published points: theirs).",
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="The runs' speculative method (prices the drafter), e.g. ngram; "
        "with --acceptance-from, the speculating run's (e.g. mtp).",
    ),
    precision: str | None = typer.Option(
        None, "--precision", help="Weight precision, fp8 or fp4 (published points: theirs)."
    ),
    acceptance_from: Path | None = typer.Option(
        None,
        "--acceptance-from",
        help="Published points: a speculating run (one concurrency) "
        "whose AL was not published; infer it from its median TPOT.",
    ),
    num_spec_tokens: int | None = typer.Option(
        None,
        "--num-speculative-tokens",
        "-k",
        min=1,
        max=64,
        help="With --acceptance-from: its K (default: the run's settings).",
    ),
    write_profile: Path | None = typer.Option(
        None,
        "--write-profile",
        help="With --acceptance-from: write the AL curve it implies (K 1..8) as a profile set "
        "of method inferred, e.g. DIR/acceptance/NAME.yaml for sim --registry DIR.",
    ),
    thinking: Thinking | None = typer.Option(
        None,
        "--thinking",
        help="With --write-profile: the run's thinking mode (the profiles' key).",
    ),
    category: str | None = typer.Option(
        None,
        "--category",
        help="With --write-profile: the profiles' workload category (default: the run's dataset).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the written document as JSON."),
    host: bool = typer.Option(
        False,
        "--host",
        help="Measure this machine (memory bandwidth, matmul FLOP/s) and write "
        "a chip entry instead of fitting runs.",
    ),
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        min=1,
        max=4096,
        help="Published points: simulate their closed loops in this many processes "
        "(default: in this process; with --ray, a local Ray's CPUs, default the cores).",
    ),
    ray: str | None = RAY_OPTION,
) -> None:
    """Fit a step cost (seconds per step) from observed runs: sim and serve --executor sim
    accept the file it writes. With --model and --hardware it fits the roofline's efficiencies
    and overhead; with --host it measures this machine as a chip entry."""
    from speclens.sim import calibrate as cal

    if output.is_dir() or output.is_symlink():
        fail(f"command line: --output: {output}: expected a file to write (not a directory "
             "or a symbolic link)", 2)  # fmt: skip
    address = ray_address(ray)
    if host:
        if runs:
            fail("command line: --host measures this machine; it takes no RUNS", 2)
        if jobs is not None or ray is not None:
            fail("command line: --jobs and --ray go with published points, not --host", 2)
        _host(output)
        return
    if not runs:
        fail("command line: RUNS: expected run directories (or --host)", 2)
    if acceptance_from is None and (write_profile or thinking or category) is not None:
        fail("command line: --write-profile, --thinking and --category go with "
             "--acceptance-from (the AL curve is inferred from its run)", 2)  # fmt: skip
    if write_profile is None and (thinking or category) is not None:
        fail("command line: --thinking and --category key the profiles --write-profile "
             "writes; give it", 2)  # fmt: skip
    if is_published(runs):
        from speclens.sim.fanout import Fanout, cores

        fanout = Fanout(jobs or (cores() if address is not None else 1), address)
        target = (None if write_profile is None else
                  ProfileTarget(write_profile, thinking and thinking.value, category))  # fmt: skip
        published(runs, output, model, hardware, parallel, precision, method, acceptance_from,
                  num_spec_tokens, as_json, fanout, target)  # fmt: skip
        return
    if jobs is not None or ray is not None:
        fail("command line: --jobs and --ray go with published points (each point's closed "
             "loop is simulated); runs with records are fitted without simulating", 2)  # fmt: skip
    if acceptance_from is not None:
        fail("command line: --acceptance-from: goes with published points (speclens import "
             "writes them); these runs have per-request records", 2)  # fmt: skip
    parallel = parallel or 1
    if (model is None) != (hardware is None):
        fail("command line: --model and --hardware go together (a roofline needs both)", 2)
    for path in runs:
        if not path.is_dir():
            fail(f"command line: RUNS: {path}: not a directory (expected a run directory)", 2)
    try:
        observed = [cal.observe(path) for path in runs]
        models = {o.model for o in observed if o.model}
        if len(models) > 1:
            fail(f"calibrate: runs of different models: {', '.join(sorted(models))}", 2)
        if model is not None and hardware is not None:
            roof, report = cal.fit_roofline(observed, _roofline(model, hardware, parallel, method))
            _write(output, cal.document(observed, roof, report))
            e = roof.efficiency
            out_console.print(
                f"roofline of {roof.model.name} on {parallel} x {roof.chip.name}: compute "
                f"efficiency {e.compute:.3g}, memory efficiency {e.memory:.3g}, overhead "
                f"{seconds(e.overhead)} per step + {seconds(e.per_sequence)} per sequence",
                markup=False,
            )  # fmt: skip
            if report["at_the_grid_edge"]:
                out_console.print(f"note: {', '.join(report['at_the_grid_edge'])} efficiency at "
                                  "the edge of the searched range", markup=False)  # fmt: skip
            if report["misfit"]:
                out_console.print(f"note: {report['misfit']}", markup=False)
            _summary(report, output)
            return
        cost, report = cal.fit(observed)
    except cal.CalibrationError as exc:
        fail(exc.lines)
    _write(output, cal.document(observed, cost, report))
    c = cost
    out_console.print(
        f"step cost: base {seconds(c.base)} + {seconds(c.per_seq)} per request + "
        f"{seconds(c.per_context_token)} per context token; prefill "
        f"{seconds(c.prefill_base or 0)} + {seconds(c.prefill_per_token or 0)} per prompt token",
        markup=False,
    )  # fmt: skip
    _summary(report, output)


def _summary(report: dict[str, Any], output: Path) -> None:
    idle = f", {report['idle_requests']} idle TTFTs" if "idle_requests" in report else ""
    out_console.print(
        f"fit: {report['requests']} requests, {report['decode_steps']} decode steps, batches of "
        f"{report['batch_widths'][0]} to {report['batch_widths'][1]} requests, decode-time error "
        f"median {report['decode_time_error_median']:.1%} (P90 "
        f"{report['decode_time_error_p90']:.1%}){idle}",
        markup=False,
    )  # fmt: skip
    if report.get("unusable"):
        out_console.print(f"warning: {report['unusable']}", markup=False)
    out_console.print(f"wrote {output}", markup=False)


def _roofline(model: str, hardware: str, parallel: int, method: str | None) -> Any:
    from speclens.acceptance import ValidationError
    from speclens.sim import catalog
    from speclens.sim.roofline import Roofline

    try:
        return Roofline(catalog.resolve_model(model, "--model", "--model"),
                        catalog.resolve_chip(hardware, "--hardware", "--hardware"),
                        parallel, method)  # fmt: skip
    except ValidationError as exc:
        fail([str(p) for p in exc.problems], 2)


def _host(output: Path) -> None:
    from speclens.sim.host import busy_note, measure

    entry = measure(output.stem)
    _write(output, entry)
    out_console.print(
        f"this machine: memory {entry['memory_bandwidth_tbps'] * 1e3:.1f} GB/s, matmul "
        f"{entry['tflops']['bf16'] * 1e3:.0f} GFLOP/s bf16 at best; wrote {output}", markup=False,
    )  # fmt: skip
    busy = busy_note(entry["measured"]["others_cpus"])
    if busy:
        out_console.print(f"warning: {busy}", markup=False)
