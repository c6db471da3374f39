"""The catalog covers InferenceX's data: chip mi325x and the rack-scale gb200 and gb300, each
against its datasheet's figures written out here, and the weights' precision a scenario and
``speclens sim --precision`` choose."""

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


#: NVIDIA's GB200 NVL72 datasheet (gb200.yaml's source), the rack of 72 GPUs: FP4 1,440,
#: FP8/FP6 720 and FP16/BF16 360 PFLOP/s, all with sparsity (dense is half); up to 13.4 TB of
#: HBM3E at 576 TB/s; NVLink 130 TB/s (1.8 TB/s a GPU, both directions together).
GB200_NVL72 = {"fp4": 1440, "fp8": 720, "bf16": 360, "hbm_tb": 13.4, "hbm_tbps": 576}
#: NVIDIA's GB300 NVL72 datasheet (gb300.yaml's source): FP4 1,440 PFLOP/s with sparsity and
#: 1,080 dense (three quarters of the sparse figure, not half), FP8/FP6 720 and
#: FP16/BF16 360 PFLOP/s with sparsity; up to 20 TB of HBM3E at 576 TB/s; NVLink 130 TB/s. Its
#: per-GPU table: 279 GB of HBM3E (288 GB marketed) at 8 TB/s.
GB300_NVL72 = {"fp4_dense": 1080, "fp8": 720, "bf16": 360, "hbm_tb": 20, "hbm_tbps": 576}
GB300_GPU_GB = 279
RACK, NVLINK_TBPS = 72, 1.8


@pytest.mark.parametrize("name", ["gb200", "gb300"])
def test_the_rack_scale_blackwells_are_nvidias_datasheets_per_gpu(name: str) -> None:
    """One GPU of the NVL72 rack: the rack's dense PFLOP/s over its 72 GPUs in TFLOP/s
    (GB200: FP4 10,000, FP8 5,000, BF16 2,500; GB300: FP4 15,000, FP8 5,000, BF16 2,500), its
    HBM and bandwidth over 72 (186 GB or 279 GB, 8 TB/s), and NVLink's 1.8 TB/s a GPU one way
    (900 GB/s)."""
    chip = catalog.chip(name)
    assert chip.source == f"https://www.nvidia.com/en-us/data-center/{name}-nvl72/"
    per_gpu = 1e3 / RACK  # PFLOP/s of the rack -> TFLOP/s of a GPU
    if name == "gb200":
        sheet = GB200_NVL72
        fp4 = sheet["fp4"] * per_gpu / 2
        memory = round(sheet["hbm_tb"] * 1e3 / RACK)  # 186.1 GB
    else:
        sheet = GB300_NVL72
        fp4 = sheet["fp4_dense"] * per_gpu
        memory = GB300_GPU_GB
        assert round(memory * RACK / 1e3) == sheet["hbm_tb"]  # 20.1 TB: the rack's 20 agrees
    dense = {"bf16": sheet["bf16"] * per_gpu / 2, "fp8": sheet["fp8"] * per_gpu / 2, "fp4": fp4}
    assert chip.tflops == pytest.approx(dense, rel=1e-12)
    assert (chip.tflops["bf16"], chip.tflops["fp8"]) == (2500, 5000)
    assert chip.tflops["fp4"] == (10_000 if name == "gb200" else 15_000)
    assert chip.memory_gb == memory
    assert chip.memory_bandwidth_tbps == sheet["hbm_tbps"] / RACK == 8.0
    assert chip.interconnect_gbps == NVLINK_TBPS * 1e3 / 2
    assert round(130 / RACK, 1) == NVLINK_TBPS  # the rack's 130 TB/s over its GPUs


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
