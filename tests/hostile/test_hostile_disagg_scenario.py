"""``speclens sim`` on disaggregated scenarios it cannot run as stated: each refusal is one line
naming the file and the field, exit 1 for the scenario (2 for a flag or a sweep point), before
any solving, with nothing written."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

#: DeepSeek-R1 FP4 on GB200: 2 prefill workers (TP 4, EP 4, DP attention), 1 decode worker
#: (TP 8, EP 8) speculating with MTP at K 3 at a stated AL.
GOOD: dict[str, Any] = {
    "model": "deepseek-r1",
    "hardware": "gb200",
    "precision": "fp4",
    "deployment": {"pools": [
        {"role": "prefill", "workers": 2, "parallel": 4, "expert_parallel": 4,
         "dp_attention": True},
        {"role": "decode", "workers": 1, "parallel": 8, "expert_parallel": 8,
         "engine": {"speculative": {"method": "mtp", "num_spec_tokens": 3}}},
    ]},
    "workload": {"input_tokens": 1024, "output_tokens": 256, "concurrency": 32, "requests": 64,
                 "acceptance": {"num_spec_tokens": 3, "acceptance_length": 2.5,
                                "source": "a test's stated value"}},
}  # fmt: skip

SPEC = {"speculative": {"method": "mtp", "num_spec_tokens": 3}}


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _changed(pools: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    if pools is not None:
        data["deployment"]["pools"] = pools
    for key, value in top.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    if not any("engine" in pool for pool in data["deployment"]["pools"]):
        del data["workload"]["acceptance"]  # else a warning: a value no pool uses
    return data


def _refused(run_cli: Any, tmp_path: Path, data: dict[str, Any], *flags: str,
             code: int = 1) -> str:  # fmt: skip
    """The one line of a refused run (``code``), with nothing written to its --output-dir."""
    path = _write(tmp_path, data)
    out = tmp_path / "out"
    got, stdout, stderr = run_cli("sim", path, *flags, "--output-dir", out)
    assert got == code, (stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert not out.exists()
    return lines[0].replace(str(path), "S")


PREFILL = {"role": "prefill", "parallel": 4}
DECODE = {"role": "decode", "parallel": 8, "engine": SPEC}


@pytest.mark.parametrize(
    ("pools", "where", "what"),
    [
        ([PREFILL, DECODE, {"role": "prefill", "parallel": 4}], "deployment.pools[2].role",
         "is prefill, as deployment.pools[0] is: a disaggregated deployment has exactly one "
         "prefill pool and one decode pool"),
        ([DECODE], "deployment.pools[0].role", "is decode, but no pool prefills: a decode pool "
         "needs a prefill pool (role: prefill); the KV cache moves from one to the other"),
        ([PREFILL], "deployment.pools[0].role", "is prefill, but no pool decodes: a prefill "
         "pool needs a decode pool (role: decode); the KV cache moves from one to the other"),
        ([PREFILL, DECODE, {"parallel": 8}], "deployment.pools[2].role", "is mixed in a "
         "disaggregated deployment: it has one prefill pool, one decode pool and no mixed pool"),
        ([{**PREFILL, "engine": SPEC}, {"role": "decode", "parallel": 8}],
         "deployment.pools[0].engine.speculative",
         "only decode pools speculate; an acceptance value names the decode pool's K"),
        ([PREFILL, {**DECODE, "step_cost": {"base": 0.01}}], "deployment.pools[1].step_cost",
         "is not allowed in a disaggregated deployment: its pools are priced by a roofline (KV "
         "bytes and links come from the catalog)"),
        ([{**PREFILL, "step_cost_file": "c.yaml"}, DECODE], "deployment.pools[0].step_cost_file",
         "is not allowed in a disaggregated deployment: its pools are priced by a roofline (KV "
         "bytes and links come from the catalog)"),
        ([PREFILL, {**DECODE, "expert_parallel": 16}], "deployment.pools[1].expert_parallel",
         "is 16, over parallel 8: expert parallelism splits the experts over a worker's GPUs "
         "(at most parallel)"),
        ([{**PREFILL, "expert_parallel": 3}, DECODE], "deployment.pools[0].expert_parallel",
         "is 3, which does not divide deepseek-r1's 256 routed experts"),
        ([{**PREFILL, "workers": 0}, DECODE], "deployment.pools[0].workers",
         "Input should be greater than or equal to 1 (got an integer (0))"),
        ([{**PREFILL, "workers": 2, "replicas": 2}, DECODE], "deployment.pools[0].workers",
         "is not allowed with replicas: workers is replicas spelt another way; give one"),
        ([PREFILL, {**DECODE, "engine": {**SPEC, "kv_cache_tokens": 10**6}}],
         "deployment.pools[1].engine.kv_cache_tokens",
         "is not read in a disaggregated deployment: a worker's KV capacity is its roofline's "
         "(its GPUs' memory beyond the weights); leave it out"),
        ([{**PREFILL, "parallel": 1, "expert_parallel": 1, "dp_attention": False}, DECODE],
         "deployment.pools[0].parallel", "deepseek-r1's weights (350.0 GB) do not fit in 1 x "
         "186 GB of gb200 at 90% use: raise parallel"),
        ([PREFILL, {**DECODE, "workers": 600}], "deployment.pools[1].replicas", "4,804 GPUs "
         "over the pools (parallel x replicas), over the 4,096 a run records"),
    ],
)  # fmt: skip
def test_a_layout_it_cannot_run_is_one_line(
    run_cli: Any, tmp_path: Path, pools: list[dict[str, Any]], where: str, what: str
) -> None:
    assert _refused(run_cli, tmp_path, _changed(pools)) == f"S: {where}: {what}"


def test_a_disaggregated_deployment_needs_hardware(run_cli: Any, tmp_path: Path) -> None:
    line = _refused(run_cli, tmp_path, _changed(hardware=None, precision=None))
    assert line == ("S: hardware: is not set: a disaggregated deployment is priced by a roofline "
                    "(KV bytes and links come from the catalog): name the chip")  # fmt: skip


def test_expert_parallelism_on_a_model_without_experts(run_cli: Any, tmp_path: Path) -> None:
    pools = [{"role": "prefill", "parallel": 2, "expert_parallel": 2},
             {"role": "decode", "parallel": 2}]  # fmt: skip
    data = _changed(pools, model="llama-3.1-8b", precision=None)
    assert _refused(run_cli, tmp_path, data) == (
        "S: deployment.pools[0].expert_parallel: is 2, but llama-3.1-8b has no routed experts "
        "to spread: leave it at 1")  # fmt: skip


def test_expert_parallelism_on_a_step_cost_pool(run_cli: Any, tmp_path: Path) -> None:
    """A single-node pool priced by its step cost: EP would price nothing."""
    data = {"model": "m", "deployment": {"pools": [{"parallel": 2, "expert_parallel": 2}]},
            "workload": {"concurrency": 2, "requests": 4}}  # fmt: skip
    assert _refused(run_cli, tmp_path, data) == (
        "S: deployment.pools[0].expert_parallel: prices nothing here: the pool's steps are "
        "priced by a step cost, and expert parallelism and DP attention are a roofline's (name "
        "hardware, without step_cost)")  # fmt: skip


@pytest.mark.parametrize(
    ("workload", "where", "what"),
    [
        ({"concurrency": None}, "workload.concurrency", "is not set, nor workload.rate: a "
         "disaggregated deployment is solved in its steady state, closed at a concurrency or "
         "open at a rate; give one"),
        ({"concurrency": None, "rate": 2.0, "burstiness": 2.0}, "workload.burstiness", "is 2: "
         "the disaggregated steady state queues prompts as deterministic batches at the mean "
         "rate, so it models no burstiness; leave it at 1"),
        ({"requests": 300_000}, "workload.requests", "is 300,000: the steady state draws "
         "lengths for at most 200,000 requests"),
    ],
)  # fmt: skip
def test_a_workload_it_cannot_solve_is_one_line(
    run_cli: Any, tmp_path: Path, workload: dict[str, Any], where: str, what: str
) -> None:
    data = copy.deepcopy(GOOD)
    for key, value in workload.items():
        if value is None:
            data["workload"].pop(key)
        else:
            data["workload"][key] = value
    assert _refused(run_cli, tmp_path, data) == f"S: {where}: {what}"


def test_a_draft_coverage_below_one_is_one_line(run_cli: Any, tmp_path: Path) -> None:
    """The steady state drafts on every decode step: an AL stated at a lower coverage would
    price steps it never drafts as drafting."""
    data = copy.deepcopy(GOOD)
    data["workload"]["acceptance"]["draft_coverage"] = 0.8
    assert _refused(run_cli, tmp_path, data) == (
        "S: workload.acceptance.draft_coverage: drafts on 0.8 of decode steps at K 3: the "
        "disaggregated steady state drafts on every decode step; state an AL at coverage 1"
    )


def test_an_open_loop_past_capacity_is_one_line(run_cli: Any, tmp_path: Path) -> None:
    """1,000 requests a second: far past what two prefill workers serve."""
    data = copy.deepcopy(GOOD)
    data["workload"].pop("concurrency")
    data["workload"]["rate"] = 1000.0
    line = _refused(run_cli, tmp_path, data)
    assert line.startswith("S: workload.rate: the prefill pool serves at most ")
    assert line.endswith("requests/s, the rate is 1000: the open loop's queues grow without bound")


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--exact"], "--exact: a disaggregated deployment is modelled by its steady state "
         "(sim/disagg.py), not stepped: there is no step-exact loop of it"),
        (["--ray"], "--ray: a disaggregated point is solved in this process (under a "
         "millisecond a point): there is nothing to fan out"),
        (["--sweep", "deployment.pools[1].parallel=4,8"], "command line: --sweep: "
         "deployment.pools[1].parallel=4 with S: deployment.pools[1].expert_parallel: is 8, "
         "over parallel 4: expert parallelism splits the experts over a worker's GPUs (at most "
         "parallel)"),
        (["--sweep", "deployment.pools[5].workers=1,2"], "command line: --sweep: "
         "deployment.pools[5].replicas: S has 2 pools"),
        (["--sweep", "deployment.pools[0].workers=1,2", "--sweep",
          "deployment.pools[0].replicas=3"], "--sweep: deployment.pools[0].replicas is given "
         "twice; give each axis once (a grid: --sweep num_spec_tokens=... --sweep "
         "concurrency=...)"),
        (["--sweep", "deployment.pools[0].workers=1,2", "--at-interactivity", "50"],
         "--at-interactivity needs --sweep concurrency=...: each configuration's curve runs "
         "over concurrency"),
    ],
)  # fmt: skip
def test_a_flag_it_cannot_take_is_one_line(
    run_cli: Any, tmp_path: Path, flags: list[str], line: str
) -> None:
    assert _refused(run_cli, tmp_path, GOOD, *flags, code=2) == line


def test_a_pool_axis_on_a_single_node_scenario_is_refused(run_cli: Any, tmp_path: Path) -> None:
    data = {"model": "m", "deployment": {"pools": [{"parallel": 2}]},
            "workload": {"concurrency": 2, "requests": 4}}  # fmt: skip
    assert _refused(run_cli, tmp_path, data, "--sweep", "deployment.pools[0].workers=1,2",
                    code=2) == ("--sweep: deployment.pools[0].replicas goes with a "
                                "disaggregated scenario (a prefill pool and a decode pool)")  # fmt: skip
    line = _refused(run_cli, tmp_path, data, "--sweep", "num_spec_tokens=0,1", code=2)
    assert line == "--sweep: points must be integers >= 1"
