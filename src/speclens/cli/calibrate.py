"""``speclens calibrate RUN_DIR... -o COST.yaml``: a step cost fitted from observed runs of any
engine, from what the client saw (``speclens.sim.calibrate``).

Exit codes: 0 written; 1 a run that cannot be read or a fit that is refused (one load point,
too few steps); 2 usage.
"""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from speclens.cli._common import fail, out_console


def calibrate(
    runs: list[Path] = typer.Argument(
        ..., help="Run directories (bench --output-dir) of one engine, at two load points or more."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The step-cost YAML to write."),
) -> None:
    """Fit a step cost (seconds per step) from observed runs: sim and serve --executor sim
    accept the file it writes."""
    from speclens.sim import calibrate as cal

    for path in runs:
        if not path.is_dir():
            fail(f"command line: RUNS: {path}: not a directory (expected a run directory)", 2)
    if output.is_dir() or output.is_symlink():
        fail(f"command line: --output: {output}: expected a file to write (not a directory "
             "or a symbolic link)", 2)  # fmt: skip
    try:
        observed = [cal.observe(path) for path in runs]
        models = {o.model for o in observed if o.model}
        if len(models) > 1:
            fail(f"calibrate: runs of different models: {', '.join(sorted(models))}", 2)
        cost, report = cal.fit(observed)
    except cal.CalibrationError as exc:
        fail(exc.lines)
    text = yaml.safe_dump(cal.document(observed, cost, report), sort_keys=False)
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{output}: cannot write: {exc.strerror or exc}")
    c = cost
    out_console.print(
        f"step cost: base {c.base * 1e3:.3f} ms + {c.per_seq * 1e3:.3f} ms per request + "
        f"{c.per_context_token * 1e6:.3f} us per context token; prefill "
        f"{(c.prefill_base or 0) * 1e3:.3f} ms + {(c.prefill_per_token or 0) * 1e6:.2f} us per "
        f"prompt token", markup=False,
    )  # fmt: skip
    out_console.print(
        f"fit: {report['requests']} requests, {report['decode_steps']} decode steps, batches of "
        f"{report['batch_widths'][0]} to {report['batch_widths'][1]} requests, decode-time error "
        f"median {report['decode_time_error_median']:.1%} (P90 "
        f"{report['decode_time_error_p90']:.1%}), {report['idle_requests']} idle TTFTs",
        markup=False,
    )  # fmt: skip
    out_console.print(f"wrote {output}", markup=False)
