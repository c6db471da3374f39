"""Disaggregated predictions against InferenceX's published multi-node runs (where the data is
beside the project: ``../shared/data/inferencex``), the issue's two referees:

- MI355X, Mori + SGLang, FP8, 1024/1024: the roofline calibrated on every disaggregated MTP-off
  point (all layouts and dates), the AL at K 3 inferred from the lowest-concurrency MTP point,
  every other MTP point predicted: median TPOT error at most 20%;
- GB200, Dynamo + TensorRT-LLM, FP4, 1024/1024: the MTP-off points at the catalog's defaults
  alone, no calibration: median TPOT error at most 30%.

The points are read as ``speclens import inferencex`` writes them (``benchmarks/
inferencex_disagg.py``); the numbers the benchmark prints are in ``benchmarks/README.md``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchkit import DISAGG, inferencex_script
from publishedkit import INFERENCEX_DIR
from speclens.sim import fit_points as fp

pytestmark = pytest.mark.skipif(not (INFERENCEX_DIR / "benchmarks.json").is_file(),
                                reason="InferenceX's published runs are not beside the project")  # fmt: skip


@pytest.fixture(scope="module")
def section() -> Any:
    return inferencex_script("inferencex_disagg_test", DISAGG)


def _configuration(section: Any, key: tuple[Any, ...]) -> dict[str, Any]:
    configs, _ = section.configurations(INFERENCEX_DIR)
    (found,) = [c for c in configs if c["key"] == key]
    return found


def test_mi355x_mtp_predicted_from_mtp_off_and_one_inferred_al(section: Any) -> None:
    """Every MTP-off point (all layouts and dates) in one fit, the AL from the lowest
    concurrency's MTP point, every other MTP point (every date) predicted."""
    config = _configuration(section, ("mi355x", "mori-sglang", "fp8", 1024, 1024))
    off, on = config["every_off"], config["every_on"]
    assert len(off) >= 9 and len(on) >= 18
    assert len({str(p.settings["decode"]) for p in off}) >= 3  # several layouts in one fit
    fit = section.fit(off)
    found = fp.infer_acceptance(fit, on[0], "mtp", 3)
    assert 1.0 < found.acceptance_length < 4.0
    errors = section.errors(on[1:], fit.roofline.efficiency, fit.front_latency_s, 3,
                            found.acceptance_length)  # fmt: skip
    assert float(np.median(errors[:, 0])) <= 0.20


def test_gb200_mtp_off_from_the_catalogs_defaults_alone(section: Any) -> None:
    from speclens.sim import catalog

    config = _configuration(section, ("gb200", "dynamo-trt", "fp4", 1024, 1024))
    chip = catalog.chip("gb200")
    assert chip.efficiency is not None  # fitted on its disaggregated points, its notes say
    errors = section.errors(config["every_off"], chip.efficiency, 0.0)  # every date
    assert float(np.median(errors[:, 0])) <= 0.30
