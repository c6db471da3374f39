"""The simulator: scenario checks, the virtual-time loop, the command, and its fidelity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from speclens.acceptance import ValidationError, minimum_variance_rates
from speclens.engine import Engine, EngineConfig, SpeculativeConfig, StepCost, StepRecord
from speclens.sim.request import SimRequest
from speclens.sim.scenario import Scenario, load_scenario
from speclens.sim.simulate import _run_replica, simulate

BASE = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 64,
                 "output_tokens": 64, "concurrency": 8, "requests": 64},
}  # fmt: skip


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_scenario_problems_are_all_reported_with_their_paths(tmp_path: Path) -> None:
    bad = {
        "model": "",
        "deployment": {"pools": [{"role": "router", "engine": {"speculative": {"method": "x", "num_spec_tokens": 0}}}]},
        "workload": {"rate": 1.0, "concurrency": 4, "thinking": True},
    }  # fmt: skip
    with pytest.raises(ValidationError) as info:
        load_scenario(_write(tmp_path, bad))
    paths = {p.path for p in info.value.problems}
    assert {"model", "deployment.pools[0].role", "deployment.pools[0].engine.speculative.num_spec_tokens",
            "workload.concurrency", "workload.thinking"} <= paths  # fmt: skip


def test_bundle_check_refuses_an_inline_value_at_another_k(tmp_path: Path) -> None:
    data = json.loads(json.dumps(BASE))
    data["acceptance"] = {"value": {"num_spec_tokens": 3, "acceptance_length": 2.5}}
    data["workload"]["acceptance"] = {"num_spec_tokens": 5, "acceptance_length": 2.5}
    with pytest.raises(ValidationError) as info:
        load_scenario(_write(tmp_path, data))
    assert {p.path for p in info.value.problems} == {
        "acceptance.value.num_spec_tokens",
        "workload.acceptance.num_spec_tokens",
    }


def test_a_stated_value_without_a_speculating_pool_warns(tmp_path: Path, caplog) -> None:
    data = json.loads(json.dumps(BASE))
    data["deployment"]["pools"][0]["engine"] = {}
    data["acceptance"] = {"value": {"num_spec_tokens": 3, "acceptance_length": 2.5}}
    load_scenario(_write(tmp_path, data))
    assert "no pool speculates" in caplog.text


def test_simulate_realizes_the_resolved_schedule(tmp_path: Path) -> None:
    scenario = Scenario.model_validate(BASE)
    result = simulate(scenario, tmp_path, minimum_variance_rates(3.78, 7), seed=1)
    # 64 requests x 64 tokens; ~16 verify steps each: AL within 4 SE of 3.78 (Bernoulli 0.78).
    steps = sum(result["histogram"].values())
    assert set(result["histogram"]) == {"2", "3"}
    assert abs(result["realized_acceptance_length"] - 3.78) < 4 * math.sqrt(0.78 * 0.22 / steps)
    assert result["throughput"]["output_tokens_per_s"] > 0
    assert result["latency_ms"]["ttft"]["p50"] > 0 and result["latency_ms"]["tpot"]["p50"] > 0


def test_higher_acceptance_predicts_higher_throughput(tmp_path: Path) -> None:
    scenario = Scenario.model_validate(BASE)
    low = simulate(scenario, tmp_path, minimum_variance_rates(1.5, 7))
    high = simulate(scenario, tmp_path, minimum_variance_rates(6.0, 7))
    assert high["throughput"]["output_tokens_per_s"] > 2 * low["throughput"]["output_tokens_per_s"]


def test_cli_resolves_from_the_registry_and_sweeps(run_cli, tmp_path: Path) -> None:
    path = _write(tmp_path, BASE)
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["resolution"]["acceptance_length"] == 3.78
    assert result["resolution"]["profile_set"] == "inferencex-golden-al-2026-08"
    plot = tmp_path / "sweep.png"
    code, out, err = run_cli(
        "sim", path, "--sweep", "num_spec_tokens=1..3", "--json", "--plot", plot
    )
    assert code == 0, err
    rows = json.loads(out)
    assert [r["resolution"]["acceptance_length"] for r in rows] == [1.84, 2.45, 2.87]
    assert plot.stat().st_size > 0
    code, out, err = run_cli("sim", path, "--acceptance-length", "2.0", "--json")
    assert json.loads(out)["resolution"]["layer"] == "cli"


@pytest.fixture(scope="module")
def recorded(one_thread: None) -> list[StepRecord]:
    """A real torch run's steps: forced AL 3.78 at K 7, closed loop at concurrency 3 over
    requests of differing lengths (so batches grow, shrink and mix prefill with decode)."""
    engine = _engine(3.78)
    _run_replica(engine, _requests(), 3)
    return engine.steps


def _engine(length: float, executor: str = "torch", cost: StepCost | None = None) -> Engine:
    spec = SpeculativeConfig(
        method="draft_model", num_speculative_tokens=7, acceptance_length=length
    )
    config = EngineConfig(
        speculative=spec, executor=executor, step_cost=cost or StepCost(), detokenize=False
    )  # type: ignore[arg-type]
    return Engine(config)


def _requests() -> list[SimRequest]:
    return [SimRequest(i, 0.0, 24 + 5 * i, 16 + 7 * i) for i in range(6)]


def _shape(step: StepRecord) -> tuple[str, int, int, int]:
    return step.kind, step.num_requests, step.query_tokens, step.context_tokens


PRICES = dict(base=3e-3, per_token=4e-5, per_seq=2e-5, per_context_token=3e-8,
              draft_base=6e-4, draft_per_token=7e-6)  # fmt: skip


@pytest.mark.parametrize(
    "cost",
    [StepCost(**PRICES), StepCost(**PRICES, prefill_base=1e-3, prefill_per_token=2e-5)],
    ids=["prefill-as-verify", "prefill-apart"],
)
def test_sim_replays_a_recorded_torch_run_at_the_step_cost_formula(
    recorded: list[StepRecord], cost: StepCost
) -> None:
    """The deterministic half of the simulator's fidelity (the timing half is
    ``benchmarks/fidelity.py``): given the same requests and forced acceptance, the sim executor
    schedules exactly the steps the torch run recorded, prices each one by the ``StepCost``
    formula written out here, and its clock is their sum."""
    engine = _engine(3.78, "sim", cost)
    requests = _requests()
    _run_replica(engine, requests, 3)
    assert [_shape(s) for s in engine.steps] == [_shape(s) for s in recorded]
    assert {s.kind for s in recorded} == {"prefill", "decode"}
    assert len({s.num_requests for s in recorded}) >= 3
    k, clock = 7, 0.0
    for step in engine.steps:
        _, n, query, context = _shape(step)
        if step.kind == "prefill" and cost.prefill_base is not None:
            assert cost.prefill_per_token is not None
            price = cost.prefill_base + cost.prefill_per_token * query
        else:
            price = (cost.base + cost.per_token * query + cost.per_seq * n
                     + cost.per_context_token * context)  # fmt: skip
        draft = k * (cost.draft_base + cost.draft_per_token * n) if step.kind == "decode" else 0.0
        assert step.draft_seconds == pytest.approx(draft, rel=1e-12, abs=0.0)
        assert step.seconds == pytest.approx(price + draft, rel=1e-12, abs=0.0)
        clock += step.seconds
    assert engine.clock == pytest.approx(clock, rel=1e-12, abs=0.0)
    assert max(r.finish or 0.0 for r in requests) == engine.clock
