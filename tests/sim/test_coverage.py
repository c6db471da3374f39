"""Draft coverage in the simulator: a request-step that drafts nothing is a plain decode step
(one token, no drafter work, one verify slot), and coverage 1.0 changes nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from speclens.acceptance import minimum_variance_rates
from speclens.engine import Engine, EngineConfig, SpeculativeConfig, StepCost
from speclens.sim.coverage import cover
from speclens.sim.request import SimRequest
from speclens.sim.scenario import Scenario
from speclens.sim.simulate import _run_replica, simulate

K = 3
#: AL 2 at K 3 with the minimum-variance schedule is [1, 0, 0]: a drafting step gains exactly
#: one draft, so a request-step's tokens are 1 + Bernoulli(coverage), variance c(1 - c).
AL = 2.0
SCENARIO = {
    "model": "m",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "ngram", "num_spec_tokens": K}}}]},
    "workload": {"input_tokens": 32, "output_tokens": 64, "concurrency": 8, "requests": 64},
}  # fmt: skip


class RecordingCost(StepCost):
    """A ``StepCost`` that keeps the inputs of every verify and drafter price it gives (the
    logs are attached once the engine has checked the prices, which reads every attribute)."""

    verifies: list[tuple[int, int, int]]
    drafts: list[int]

    def verify(self, query_tokens: int, requests: int, context_tokens: int) -> float:
        self.verifies.append((query_tokens, requests, context_tokens))
        return super().verify(query_tokens, requests, context_tokens)

    def draft(self, requests: int) -> float:
        self.drafts.append(requests)
        return super().draft(requests)


def _engine(cost: StepCost) -> Engine:
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, acceptance_length=AL)
    config = EngineConfig(
        speculative=spec, executor="sim", step_cost=cost, detokenize=False, seed=5
    )  # type: ignore[arg-type]
    engine = Engine(config)
    cost.verifies, cost.drafts = [], []  # type: ignore[attr-defined]
    return engine


def _requests() -> list[SimRequest]:
    return [SimRequest(i, 0.0, 16 + 3 * i, 40 + 5 * i) for i in range(12)]


def test_uncovered_request_steps_are_priced_as_plain_decode_steps() -> None:
    """The step cost's own inputs: every request-step takes 1 verify slot plus its drafts
    (exactly 1 + K x drafting request-steps in all), the drafter is priced once per step over
    only the requests that draft, and not at all on a step where none does. The shares are
    within 4 standard errors of coverage 0.4 (Bernoulli per request-step; false alarm ~6e-5)."""
    coverage = 0.4
    cost = RecordingCost(prefill_base=1e-3, prefill_per_token=1e-5)  # prefill off verify()
    engine = _engine(cost)
    tally = cover(engine, coverage, np.random.default_rng(11))
    assert tally is not None
    _run_replica(engine, _requests(), 4)
    steps = tally.request_steps
    drafting = engine.stats.num_drafts
    assert tally.drafting_steps == drafting
    assert sum(n for _, n, _ in cost.verifies) == steps
    assert sum(q for q, _, _ in cost.verifies) == steps + K * drafting
    assert sum(cost.drafts) == drafting
    assert len(cost.drafts) < len(cost.verifies)  # some steps drafted nothing: no drafter call
    assert all(d > 0 for d in cost.drafts)
    se = math.sqrt(coverage * (1 - coverage) / steps)
    assert abs(drafting / steps - coverage) < 4 * se
    slots = sum(q for q, _, _ in cost.verifies) / steps
    assert abs(slots - (1 + K * coverage)) < 4 * K * se
    # Full coverage: K + 1 slots and a drafter price for every request-step.
    full = RecordingCost(prefill_base=1e-3, prefill_per_token=1e-5)
    engine = _engine(full)
    tally = cover(engine, 1.0, np.random.default_rng(11))
    assert tally is not None
    _run_replica(engine, _requests(), 4)
    assert sum(q for q, _, _ in full.verifies) == (K + 1) * tally.request_steps
    assert sum(full.drafts) == tally.request_steps == tally.drafting_steps


def test_coverage_one_prices_and_emits_exactly_what_the_engine_does_alone() -> None:
    """Guard: installing full coverage draws nothing and changes no price, step or token."""
    plain, covered = _engine(StepCost()), _engine(StepCost())
    assert cover(covered, 1.0, np.random.default_rng(0)) is not None
    runs = []
    for engine in (plain, covered):
        requests = _requests()
        _run_replica(engine, requests, 4)
        runs.append((engine.clock, engine.steps, [(r.first_token, r.finish) for r in requests]))
    assert runs[0] == runs[1]


def test_sim_tokens_per_step_follow_coverage(tmp_path: Path) -> None:
    """Coverage 0.4 at AL 2: tokens per decode request-step 0.4 x 2 + 0.6 = 1.4, realized AL
    still 2 (AL counts only the steps that drafted); both within 4 SE (Bernoulli, var 0.24)."""
    scenario = Scenario.model_validate(SCENARIO)
    rates = minimum_variance_rates(AL, K)
    result = simulate(scenario, tmp_path, rates, seed=3, draft_coverage=0.4)
    drafting = sum(result["histogram"].values())
    steps = drafting / result["draft_coverage"]
    se = math.sqrt(0.4 * 0.6 / steps)
    assert result["realized_acceptance_length"] == AL
    assert abs(result["draft_coverage"] - 0.4) < 4 * se
    assert abs(result["tokens_per_step"] - 1.4) < 4 * se
    full = simulate(scenario, tmp_path, rates, seed=3)
    assert full["draft_coverage"] == 1.0 and full["tokens_per_step"] == AL
    # Fewer tokens per step, each step no dearer: the covered run is slower in virtual time.
    assert result["makespan_s"] > full["makespan_s"]


def test_sim_command_takes_coverage_from_the_resolution_and_prints_it(
    run_cli, tmp_path: Path
) -> None:
    data = json.loads(json.dumps(SCENARIO))
    data["acceptance"] = {
        "value": {"num_spec_tokens": K, "acceptance_length": AL, "draft_coverage": 0.4}
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["resolution"]["draft_coverage"] == 0.4
    assert 0.3 < result["draft_coverage"] < 0.5
    assert result["tokens_per_step"] == pytest.approx(1 + result["draft_coverage"], abs=0.02)
    code, out, err = run_cli("sim", path)
    assert code == 0, err
    assert "coverage" in out and "tok/step" in out
    assert f"{result['draft_coverage']:.3f}" in out
    assert "drafting on 0.4 of decode steps" in out
