"""The simulator's scenario file: model, hardware, deployment pools, workload, acceptance pin.

Validated like the registry: every problem at once, as ``<file>: <path.to.field>: <what>``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from speclens.acceptance import AcceptancePin, AcceptanceValue, Problem, ValidationError, read_yaml
from speclens.acceptance.files import inside, validate
from speclens.acceptance.schema import (
    Category,
    NonEmptyStr,
    NumSpecTokens,
    Thinking,
    _Model,
)
from speclens.sim.cost import StepCost

log = logging.getLogger(__name__)

PositiveInt = Annotated[int, Field(ge=1)]


class Speculative(_Model):
    method: NonEmptyStr
    num_spec_tokens: NumSpecTokens


class PoolEngine(_Model):
    speculative: Speculative | None = None
    max_num_seqs: PositiveInt = 256
    max_model_len: PositiveInt = 32768
    kv_cache_tokens: PositiveInt = 4_000_000


#: A pool's step cost (``step_cost``, or the file ``step_cost_file`` names): the engine's own
#: ``StepCost``, validated here as the rest of the file is.
StepCostSpec = StepCost


class Pool(_Model):
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    name: NonEmptyStr | None = None
    parallel: PositiveInt = 1
    replicas: PositiveInt = 1
    engine: PoolEngine = Field(default_factory=PoolEngine)
    step_cost: StepCost | None = None
    step_cost_file: NonEmptyStr | None = None


class Deployment(_Model):
    pools: Annotated[list[Pool], Field(min_length=1)]


class Lengths(_Model):
    """Token counts: fixed (``min == max``) or uniform in [min, max]."""

    min: PositiveInt
    max: PositiveInt


class Workload(_Model):
    category: Category | None = None
    thinking: Thinking | None = None
    input_tokens: PositiveInt | Lengths = 256
    output_tokens: PositiveInt | Lengths = 256
    rate: Annotated[float, Field(gt=0)] | None = None
    concurrency: PositiveInt | None = None
    requests: PositiveInt = 1000
    burstiness: Annotated[float, Field(gt=0)] = 1.0
    acceptance: AcceptanceValue | None = None

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if data.get("rate") is not None and data.get("concurrency") is not None:
            problems.append(
                (("concurrency",), "is not allowed with rate: give one arrival process")
            )
        for name in ("input_tokens", "output_tokens"):
            spec = data.get(name)
            if isinstance(spec, dict):
                low, high = spec.get("min"), spec.get("max")
                if type(low) is int and type(high) is int and low > high:
                    problems.append(((name,), f"min {low} > max {high}"))
        return problems


class Scenario(_Model):
    model: NonEmptyStr
    hardware: NonEmptyStr | None = None
    deployment: Deployment
    workload: Workload = Field(default_factory=Workload)
    acceptance: AcceptancePin | None = None

    @property
    def speculating(self) -> list[Pool]:
        return [p for p in self.deployment.pools if p.engine.speculative is not None]


def bundle_problems(scenario: Scenario, file: str) -> list[Problem]:
    """Every inline value must name the K of each speculating pool; with none speculating, a
    stated value draws a warning (logged, not an error)."""
    values = []
    if scenario.acceptance is not None and scenario.acceptance.value is not None:
        values.append(("acceptance.value", scenario.acceptance.value))
    if scenario.workload.acceptance is not None:
        values.append(("workload.acceptance", scenario.workload.acceptance))
    pools = scenario.speculating
    if not pools:
        for path, _ in values:
            log.warning("%s: %s: states acceptance, but no pool speculates", file, path)
        return []
    problems = []
    for path, value in values:
        for index, pool in enumerate(scenario.deployment.pools):
            spec = pool.engine.speculative
            if spec is not None and spec.num_spec_tokens != value.num_spec_tokens:
                problems.append(
                    Problem(
                        file,
                        f"{path}.num_spec_tokens",
                        f"is {value.num_spec_tokens}, but deployment.pools[{index}] speculates "
                        f"K = {spec.num_spec_tokens}: a value is refused at another K, never rescaled",
                    )
                )
    return problems


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file, bundle checks included."""
    scenario = validate(Scenario, read_yaml(path), str(path))
    problems = bundle_problems(scenario, str(path))
    ks = {
        p.engine.speculative.num_spec_tokens for p in scenario.speculating if p.engine.speculative
    }
    methods = {p.engine.speculative.method for p in scenario.speculating if p.engine.speculative}
    if len(ks) > 1 or len(methods) > 1:
        problems.append(
            Problem(
                str(path),
                "deployment.pools",
                "speculating pools must share one method and K (one acceptance value)",
            )
        )
    for index, pool in enumerate(scenario.deployment.pools):
        if pool.step_cost_file is not None and pool.step_cost is not None:
            problems.append(
                Problem(
                    str(path),
                    f"deployment.pools[{index}].step_cost_file",
                    "is not allowed with step_cost",
                )
            )
    if problems:
        raise ValidationError(problems)
    return scenario


def pool_cost(pool: Pool, base: Path) -> StepCostSpec:
    """The pool's step cost: inline, from its file (relative to the scenario), or the default."""
    if pool.step_cost is not None:
        return pool.step_cost
    if pool.step_cost_file is None:
        return StepCostSpec()
    # Inside the scenario's folder only: a shared scenario must not read any file the user can.
    path = inside(base, pool.step_cost_file, "step_cost_file", str(base / pool.step_cost_file))
    return validate(StepCostSpec, read_yaml(path), str(path))
