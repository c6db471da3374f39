"""The chips' shipped efficiency defaults are what ``benchmarks/inferencex.py`` fits: each chip's
fit regenerated with that script's own code, on InferenceX's published data, and compared with
its catalog entry to the precision the entry prints (three significant figures), with the point
and deployment counts and the client front latency its notes state. A chip the data has runs
of ships defaults; a chip it has none of ships none."""

from __future__ import annotations

import math
import re
from types import ModuleType
from typing import Any

import pytest

from benchkit import inferencex_script
from publishedkit import INFERENCEX_DIR
from speclens.sim import catalog

pytestmark = [
    pytest.mark.skipif(
        not (INFERENCEX_DIR / "benchmarks.json").is_file(),
        reason="InferenceX's published data (../shared/data/inferencex/) is not present",
    ),
    pytest.mark.slow,  # a fit of 10 to 37 points a chip: 2 to 8 s each
]

#: The significant figures the chip entries print their defaults to.
PRINTED = 3


def _script() -> ModuleType:
    return inferencex_script("inferencex_benchmark")


@pytest.fixture(scope="module")
def benchmark() -> tuple[ModuleType, list[dict[str, Any]]]:
    script = _script()
    return script, script.deployments(INFERENCEX_DIR)


def _agrees(fitted: float | None, shipped: float | None) -> bool:
    """``fitted`` rounds to ``shipped`` at the printed precision: within half a unit of its last
    printed digit (a hair over, for another machine's last-bit differences); a field neither
    states (None) agrees."""
    if shipped is None or fitted is None:
        return shipped is fitted
    if shipped == 0.0:
        return fitted == 0.0
    unit = 10.0 ** (math.floor(math.log10(abs(shipped))) - PRINTED + 1)
    return abs(fitted - shipped) <= 0.5 * unit * (1 + 1e-6)


def test_the_chips_with_defaults_are_the_chips_with_runs(benchmark: Any) -> None:
    """Single-node runs fit a chip's defaults where it has any; the rack-scale chips without
    (h100, gb200, gb300) are fitted on their disaggregated runs."""
    _, deps = benchmark
    with_runs = {d["key"][0] for d in deps} & set(catalog.names("chips"))
    single = set(_fitted_on("single-node"))
    assert with_runs == single == {"b200", "b300", "h200", "mi300x", "mi325x", "mi355x"}
    assert set(_fitted_on("disaggregated")) == {"gb200", "gb300", "h100"}
    assert {n for n in catalog.names("chips") if catalog.chip(n).efficiency is not None} == (
        single | {"gb200", "gb300", "h100"})  # fmt: skip


def _fitted_on(runs: str) -> list[str]:
    return [n for n in catalog.names("chips")
            if (found := catalog.chip(n).fitted_on) is not None and found.runs == runs]  # fmt: skip


@pytest.mark.parametrize("chip", _fitted_on("single-node"))
def test_a_chips_shipped_defaults_are_its_fit_regenerated(benchmark: Any, chip: str) -> None:
    script, deps = benchmark
    fitted = script.own_defaults(deps, chip)
    entry = catalog.chip(chip)
    assert entry.efficiency is not None
    shipped = entry.efficiency.model_dump()
    for name, value in shipped.items():
        assert _agrees(fitted[name], value), (
            f"{chip}: efficiency.{name}: ships {value!r}, the fit gives {fitted[name]!r}"
        )
    notes = " ".join((entry.notes or "").split())
    stated = re.search(r"(\d+) MTP-off points of (\d+) single-", notes)
    assert stated is not None, notes
    assert (int(stated[1]), int(stated[2])) == (fitted["points"], fitted["deployments"])
    assert entry.fitted_on is not None and entry.fitted_on.model_dump() == {
        "runs": "single-node", "points": fitted["points"], "groups": fitted["deployments"],
        "concurrency": fitted["concurrency"]}  # fmt: skip
    front = re.search(r"front latency (\d+) ms", notes)
    assert front is not None, notes
    assert int(front[1]) == round(fitted["front_latency_s"] * 1e3)


def test_agreement_is_to_the_printed_digit() -> None:
    assert _agrees(4.8825e-05, 4.88e-05) and _agrees(0.0066274, 0.00663)
    assert not _agrees(4.8825e-04, 4.88e-05) and not _agrees(0.00664, 0.00663)
    assert _agrees(0.9999999999, 1.0) and not _agrees(0.994, 1.0)
    assert _agrees(0.0, 0.0) and not _agrees(1e-9, 0.0)


@pytest.fixture(scope="module")
def disaggregated() -> tuple[ModuleType, list[dict[str, Any]]]:
    from benchkit import DISAGG

    script = inferencex_script("inferencex_disagg_defaults", DISAGG)
    configs, _ = script.configurations(INFERENCEX_DIR)
    return script, [c for c in configs if c["off"]]


@pytest.mark.parametrize("chip", _fitted_on("disaggregated"))
def test_a_rack_scale_chips_defaults_are_its_disaggregated_fit_regenerated(
    disaggregated: Any, chip: str
) -> None:
    """h100, gb200 and gb300 ran no single-node DeepSeek-R1 point: their defaults are the fit on
    their disaggregated MTP-off points, every layout and date (``benchmarks/
    inferencex_disagg.py``'s ``own_defaults``), and the entry says what they rest on."""
    script, configs = disaggregated
    fitted = script.own_defaults(configs, chip)
    entry = catalog.chip(chip)
    assert entry.efficiency is not None and entry.fitted_on is not None
    for name, value in entry.efficiency.model_dump().items():
        assert _agrees(fitted[name], value), (
            f"{chip}: efficiency.{name}: ships {value!r}, the fit gives {fitted[name]!r}"
        )
    assert entry.fitted_on.model_dump() == {
        "runs": "disaggregated", "points": fitted["points"], "groups": fitted["configurations"],
        "concurrency": fitted["concurrency"]}  # fmt: skip
    notes = " ".join((entry.notes or "").split())
    stated = re.search(r"(\d+) MTP-off points of (\d+) disaggregated", notes)
    assert stated is not None, notes
    assert (int(stated[1]), int(stated[2])) == (fitted["points"], fitted["configurations"])
