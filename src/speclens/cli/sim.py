"""``speclens sim SCENARIO.yaml``: predict a deployment's throughput and latency from the
resolved acceptance, with the engine's scheduler running in virtual time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from speclens.cli._common import (
    ACCEPTANCE_LENGTH_OPTION,
    ACCEPTANCE_RATE_OPTION,
    PER_POSITION_RATES_OPTION,
    REGISTRY_OPTION,
    cli_value,
    err_console,
    fail,
    load_registry,
    out_console,
    reported,
)


def _sweep(text: str) -> tuple[str, list[int]]:
    name, sep, values = text.partition("=")
    if not sep or name not in ("num_spec_tokens", "concurrency"):
        fail(f"--sweep: expected num_spec_tokens=... or concurrency=..., got {text!r}", code=2)
    try:
        if ".." in values:
            lo, hi = (int(v) for v in values.split(".."))
            points = list(range(lo, hi + 1))
        else:
            points = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        fail(f"--sweep: expected A..B or A,B,C integers, got {values!r}", code=2)
    if not points or min(points) < 1:
        fail("--sweep: points must be integers >= 1", code=2)
    return name, points


def sim(
    scenario_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="The scenario YAML."
    ),
    acceptance_length: float | None = ACCEPTANCE_LENGTH_OPTION,
    acceptance_rate: float | None = ACCEPTANCE_RATE_OPTION,
    per_position_rates: str | None = PER_POSITION_RATES_OPTION,
    registry: list[Path] = REGISTRY_OPTION,
    sweep: str | None = typer.Option(
        None, "--sweep", help="num_spec_tokens=1..8 or concurrency=1,8,32: one row per point."
    ),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    plot: Path | None = typer.Option(
        None, "--plot", help="With --sweep: write a PNG of throughput against latency."
    ),
) -> None:
    """Simulate a scenario with the resolved acceptance."""
    from speclens.acceptance import WorkloadAcceptance, resolve
    from speclens.sim.scenario import load_scenario
    from speclens.sim.simulate import simulate

    with reported():
        scenario = load_scenario(scenario_path)
        reg = load_registry(registry)
    pools = scenario.speculating
    spec = pools[0].engine.speculative if pools else None
    name, points = _sweep(sweep) if sweep else ("", [0])
    rows: list[dict[str, Any]] = []
    for point in points:
        k = point if name == "num_spec_tokens" else (spec.num_spec_tokens if spec else None)
        resolution = None
        rates = None
        if spec is not None and k is not None:
            workload = scenario.workload
            with reported():
                resolution = resolve(
                    model=scenario.model, method=spec.method, num_spec_tokens=k,
                    hardware=scenario.hardware, registry=reg,
                    workload=WorkloadAcceptance(thinking=workload.thinking, category=workload.category, acceptance=workload.acceptance),
                    scenario=scenario.acceptance,
                    cli=cli_value(k, acceptance_length, acceptance_rate, per_position_rates),
                )  # fmt: skip
            rates = resolution.per_position_rates
        result = simulate(
            scenario, scenario_path.parent, rates, seed,
            concurrency=point if name == "concurrency" else None,
            num_spec_tokens=k if name == "num_spec_tokens" else None,
        )  # fmt: skip
        result["resolution"] = resolution.model_dump() if resolution else None
        if name:
            result["sweep"] = {name: point}
        rows.append(result)
    if as_json:
        typer.echo(json.dumps(rows if name else rows[0], indent=2))
    else:
        _print(rows, name)
    if plot is not None and name:
        _plot(rows, name, plot)
        (err_console if as_json else out_console).print(f"wrote {plot}")


def _print(rows: list[dict[str, Any]], name: str) -> None:
    table = Table(title="speclens sim")
    for col in ([name] if name else []) + [
        "AL",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TPOT p50",
        "ITL p99",
        "E2E p99",
    ]:
        table.add_column(col, justify="right")
    for r in rows:
        lat = r["latency_ms"]
        cells = [
            f"{r['realized_acceptance_length']:.3f}" if r["realized_acceptance_length"] else "-",
            f"{r['throughput']['requests_per_s']:.2f}",
            f"{r['throughput']['output_tokens_per_s']:,.0f}",
            *(
                f"{lat[m][q]:.1f} ms" if lat[m] else "-"
                for m, q in (("ttft", "p50"), ("tpot", "p50"), ("itl", "p99"), ("e2e", "p99"))
            ),
        ]
        table.add_row(*([str(r["sweep"][name])] if name else []), *cells)
    out_console.print(table)
    res = rows[0]["resolution"]
    if res:
        out_console.print(
            f"acceptance: AL {res['acceptance_length']:g} from the {res['layer']} layer"
            + (f" ({res['profile_set']}: {res['profile']})" if res.get("profile") else "")
            + (f"; source: {res['source']}" if res.get("source") else "")
        )


def _plot(rows: list[dict[str, Any]], name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["latency_ms"]["tpot"]["p50"] if r["latency_ms"]["tpot"] else float("nan") for r in rows]
    ys = [r["throughput"]["output_tokens_per_s"] for r in rows]
    ax.plot(xs, ys, marker="o")
    for r, x, y in zip(rows, xs, ys, strict=True):
        ax.annotate(f"{name}={r['sweep'][name]}", (x, y), fontsize=8)
    ax.set_xlabel("TPOT p50 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"Throughput against latency, sweeping {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
