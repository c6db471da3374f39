"""The catalog covers InferenceX's data: chip mi325x (and the rack-scale gb200, gb300) from the
datasheets, and the weights' precision a scenario and ``speclens sim --precision`` choose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from speclens.acceptance import ValidationError
from speclens.sim import catalog
from speclens.sim.roofline import Roofline
from speclens.sim.scenario import load_scenario, pool_cost


def test_mi325x_is_amds_datasheet() -> None:
    chip = catalog.chip("mi325x")
    assert chip.source.startswith("https://www.amd.com/")
    assert chip.tflops == {"bf16": 1307.4, "fp8": 2614.9}  # dense, as AMD prints them
    assert (chip.memory_gb, chip.memory_bandwidth_tbps, chip.interconnect_gbps) == (256, 6.0, 448)
    # The same CDNA 3 compute and fabric as the MI300X, more and faster memory.
    mi300x = catalog.chip("mi300x")
    assert (mi300x.tflops, mi300x.interconnect_gbps) == (chip.tflops, chip.interconnect_gbps)
    assert {"gb200", "gb300"} <= set(catalog.names("chips"))


def _scenario(tmp_path: Path, **top: object) -> Path:
    data = {
        "model": "deepseek-r1", "hardware": "b200", **top,
        "deployment": {"pools": [{"parallel": 8}]},
        "workload": {"input_tokens": 256, "output_tokens": 32, "requests": 16, "concurrency": 4},
    }  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_scenario_chooses_the_weights_precision(tmp_path: Path) -> None:
    base = load_scenario(_scenario(tmp_path))
    fp4 = load_scenario(_scenario(tmp_path, precision="fp4"))
    assert (base.precision, fp4.precision) == (None, "fp4")
    plain = pool_cost(base.deployment.pools[0], tmp_path, base)
    four = pool_cost(fp4.deployment.pools[0], tmp_path, fp4)
    assert isinstance(plain, Roofline) and isinstance(four, Roofline)
    assert four.model.experts is not None and four.model.experts.dtype == "fp4"
    assert four.expert_dtype == "fp4" and plain.expert_dtype == "fp8"
    # Half the experts' bytes: more KV capacity, and a cheaper memory-bound step.
    assert (
        fp4.deployment.pools[0].engine.kv_cache_tokens
        > base.deployment.pools[0].engine.kv_cache_tokens
    )
    assert four.decode(4, 4, 4000, 0, 0) < plain.decode(4, 4, 4000, 0, 0)
    # The override loads the file's scenario at the other precision.
    overridden = load_scenario(_scenario(tmp_path), "fp4")
    assert overridden.deployment.pools[0].engine.kv_cache_tokens == (
        fp4.deployment.pools[0].engine.kv_cache_tokens
    )
    with pytest.raises(ValidationError) as caught:
        load_scenario(_scenario(tmp_path, precision="int4"))
    (problem,) = caught.value.problems
    assert problem.path == "precision" and "'fp8'" in problem.message and "'fp4'" in problem.message


def test_sim_takes_precision_from_the_command_line(run_cli, tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    code4, out4, err4 = run_cli("sim", path, "--precision", "fp4", "--json")
    assert code4 == 0, err4
    plain, four = json.loads(out), json.loads(out4)
    assert plain["pricing"]["0"]["expert_dtype"] == "fp8"
    assert four["pricing"]["0"]["expert_dtype"] == "fp4"
    assert four["latency_ms"]["tpot"]["p50"] < plain["latency_ms"]["tpot"]["p50"]
    code, out, err = run_cli("sim", path, "--precision", "int4")
    assert code == 2 and "--precision: expected one of fp8, fp4, got 'int4'" in err
    code, out, err = run_cli("sim", "--trace", path, "--precision", "fp4")
    assert code == 2 and "--precision" in err
