"""The accuracy table the package states beside its predictions
(``registry/catalog/accuracy/inferencex.yaml``, read by ``speclens.sim.trust``) is what
``benchmarks/inferencex.py --write-trust`` writes: its chips and their deployment and point
counts are the benchmark's, and one chip's figures (leave-one-chip-out, held out, MTP) are
regenerated here with the script's own code and held to the table to the digit it prints. The
medians over every chip need the whole benchmark (5 minutes on 2 cores): the script rewrites
them with the rest."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchkit import inferencex_script
from publishedkit import INFERENCEX_DIR
from speclens.sim import catalog, trust

pytestmark = pytest.mark.skipif(
    not (INFERENCEX_DIR / "benchmarks.json").is_file(),
    reason="InferenceX's published data (../shared/data/inferencex/) is not present",
)

#: The chip regenerated: 3 deployments (2 with MTP runs), about 15 CPU seconds.
CHIP = "mi325x"


def _script() -> ModuleType:
    return inferencex_script("inferencex_benchmark_trust")


@pytest.fixture(scope="module")
def benchmark() -> tuple[ModuleType, list[dict[str, Any]]]:
    script = _script()
    deps = [d for d in script.deployments(INFERENCEX_DIR)
            if d["key"][0] in catalog.names("chips")]  # fmt: skip
    return script, deps


def test_the_tables_chips_and_counts_are_the_benchmarks(benchmark: Any) -> None:
    _, deps = benchmark
    table = trust.table()
    chips = sorted({d["key"][0] for d in deps})
    assert sorted(table.chips) == chips
    for chip in chips:
        mine = [d for d in deps if d["key"][0] == chip]
        entry = table.chips[chip]
        assert (entry.deployments, entry.points) == (len(mine), sum(len(d["off"]) for d in mine))
    assert table.held_out.deployments == table.uncalibrated.deployments == len(deps)
    with_mtp = sum(e.speculating_deployments for e in table.chips.values())
    assert 0 < table.speculating.deployments == with_mtp


def _agrees(fitted: float, stated: float) -> bool:
    """``fitted`` rounds to ``stated``, a tenth of a percentage point (what the script prints),
    within half that unit (a hair over, for another machine's last-bit differences)."""
    unit = 10.0 ** -_script().TRUST_DIGITS
    return abs(fitted - stated) <= 0.5 * unit * (1 + 1e-6)


@pytest.mark.slow  # one leave-one-chip-out fit on 105 points and 3 deployments' held-out fits
def test_a_chips_figures_are_the_benchmarks_regenerated(benchmark: Any) -> None:
    script, deps = benchmark
    pooled, errors = script.leave_chip_out(deps, CHIP)
    start = script._defaults(pooled)
    rows = [script.score(d, start) for d in deps if d["key"][0] == CHIP]
    regenerated = trust.ChipErrors(**script.chip_trust(deps, CHIP, errors, rows)).model_dump()
    shipped = trust.table().chips[CHIP].model_dump()
    assert (regenerated["speculating"] is None) == (shipped["speculating"] is None)
    for part in ("uncalibrated", "held_out", "speculating"):
        for figure, value in (regenerated[part] or {}).items():
            assert _agrees(value, shipped[part][figure]), (
                f"{CHIP}: {part}.{figure}: the table says {shipped[part][figure]!r}, the "
                f"benchmark gives {value!r}: rerun benchmarks/inferencex.py --write-trust"
            )
    assert regenerated["speculating_deployments"] == shipped["speculating_deployments"]


def test_what_the_script_writes_is_what_the_package_reads(tmp_path: Path) -> None:
    """``trust_table`` on a benchmark's rows, written by ``write_trust``, reads back as a table
    whose figures are the rows' (two chips, one with an MTP run)."""
    script = _script()
    off = [object()] * 3
    deps = [{"key": ("b200",), "off": off}, {"key": ("b200",), "off": off[:2]},
            {"key": ("h200",), "off": off}]  # fmt: skip
    rows = [{"chip": "b200", "held_out": [0.01, 0.2, 0.03],
             "mtp": {"error": [0.05, 0.1, 0.07]}},
            {"chip": "b200", "held_out": [0.03, 0.4, 0.05], "mtp": {"refused": "no"}},
            {"chip": "h200", "held_out": [0.02, 0.3, 0.04]}]  # fmt: skip
    chip_rows = [{"chip": "b200", "errors": [[0.2, 0.5, 0.1], [0.4, 0.7, 0.3]]},
                 {"chip": "h200", "errors": [[0.25, 0.55, 0.15]]}]  # fmt: skip
    names = ("held_out", "mtp", "uncalibrated")
    figures = {f"{n}_{f}": 0.1 for n in names for f in ("tpot", "ttft", "throughput")}
    figures["speedup"] = 0.08
    path = tmp_path / "accuracy.yaml"
    script.write_trust(path, script.trust_table(deps, figures, chip_rows, rows))
    table = trust.read_table(path)
    b200 = table.chips["b200"]
    assert (b200.deployments, b200.points) == (2, 5)
    assert b200.uncalibrated.model_dump() == {"tpot": 0.3, "ttft": 0.6, "throughput": 0.2}
    assert b200.held_out.model_dump() == {"tpot": 0.02, "ttft": 0.3, "throughput": 0.04}
    assert b200.speculating is not None and b200.speculating_deployments == 1
    assert b200.speculating.model_dump() == {"tpot": 0.05, "ttft": 0.1, "throughput": 0.07}
    assert table.chips["h200"].speculating is None
    assert (table.held_out.deployments, table.uncalibrated.deployments) == (3, 3)
    assert table.speculating.deployments == 1 and table.speculating.speedup == 0.08
    assert path.read_text().startswith("# Written by `python benchmarks/inferencex.py")
