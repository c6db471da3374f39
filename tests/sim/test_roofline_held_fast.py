"""Held fast: Llama-3.1-8B bf16 on one H100 at concurrency 1 never beats reading its weights.

A decode step reads every weight a token runs through once: 2 bytes x (8,029,995,008 parameters,
the norms aside, less the 525,336,576 of the embedding table, of which a step gathers one row) =
15,009,316,864 bytes; at the H100's 3.35 TB/s that is 4.48 ms, however efficient the engine.
With the default efficiencies (80% of the bandwidth, 1 ms a step) a step is 6.6 ms, above the
4.79 ms of every weight, the embedding included (16.06 GB / 3.35 TB/s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from speclens.sim import catalog
from speclens.sim.roofline import Efficiency, Roofline
from speclens.sim.scenario import load_scenario
from speclens.sim.simulate import simulate

PARAMETERS = 32 * (41_943_040 + 176_160_768) + 2 * 525_336_576  # Llama-3.1-8B, the card's 8.03B
READ = 2 * (PARAMETERS - 525_336_576)  # bytes a decode step reads: all but the embedding table
BANDWIDTH = 3.35e12  # H100 SXM, its datasheet
#: The most generous efficiencies the schema allows: every peak reached, nothing paid besides.
GENEROUS = Efficiency(compute=1.0, memory=1.0, interconnect=1.0, overhead=0.0,
                      per_sequence=0.0, all_reduce_latency=0.0, memory_utilization=1.0)  # fmt: skip
CONTEXTS = np.array([1, 128, 1024, 8192, 32768, 131072])


def test_the_floor_by_hand() -> None:
    assert PARAMETERS == 8_029_995_008 and READ == 15_009_316_864
    assert pytest.approx(4.4804e-3, rel=1e-4) == READ / BANDWIDTH
    assert pytest.approx(4.7940e-3, rel=1e-4) == 2 * PARAMETERS / BANDWIDTH


@pytest.mark.parametrize("chip_default", [False, True], ids=["given", "chip-default"])
def test_a_decode_step_at_concurrency_one_never_beats_the_weights(chip_default: bool) -> None:
    model, h100 = catalog.model("llama-3.1-8b"), catalog.chip("h100")
    generous_chip = h100.model_copy(update={"efficiency": GENEROUS})
    default = Roofline(model, h100, efficiency=Efficiency())  # the global defaults
    generous = (
        Roofline(model, generous_chip)
        if chip_default
        else Roofline(model, h100, efficiency=GENEROUS)
    )
    assert generous.efficiency == GENEROUS
    ones = np.ones(len(CONTEXTS), dtype=np.int64)
    for roof, floor in ((default, 2 * PARAMETERS / BANDWIDTH), (generous, READ / BANDWIDTH)):
        steps = roof.decode(ones, ones, CONTEXTS, 0 * ones, 0)
        assert (steps >= floor).all(), (steps, floor)
        for context in CONTEXTS:  # one at a time too, as the step-exact loop prices them
            assert roof.decode(1, 1, int(context), 0, 0) >= floor
            assert roof._decode_formula(1, 1, int(context), 0, 0) >= floor
    # At batch 1 the weights are nearly all of a generous step: 4.48 ms and the KV's read.
    assert generous.decode(1, 1, 1, 0, 0) == pytest.approx(READ / BANDWIDTH, rel=1e-4)
    assert default.decode(1, 1, 1, 0, 0) == pytest.approx(
        READ / (BANDWIDTH * 0.8) + 1e-3 + 2e-5, rel=1e-4
    )  # 6.6 ms, as the issue measured the catalog's prediction


def test_a_simulated_tpot_at_concurrency_one_never_beats_the_weights(tmp_path: Path) -> None:
    generous = GENEROUS.model_dump()
    generous.pop("memory_utilization")
    scenario = {
        "model": "llama-3.1-8b", "hardware": "h100",
        "deployment": {"pools": [{"efficiency": generous}]},
        "workload": {"input_tokens": 64, "output_tokens": 32, "requests": 8},
    }  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = simulate(load_scenario(path), tmp_path, None, concurrency=1, fast=True)
    tpot = result["latency_ms"]["tpot"]
    assert tpot["min"] >= 1e3 * READ / BANDWIDTH, tpot
