"""The simulator's scenario file: model, hardware, deployment pools, workload, acceptance pin.

Validated like the registry: every problem at once, as ``<file>: <path.to.field>: <what>``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, model_validator

from speclens.acceptance import AcceptancePin, AcceptanceValue, Problem, ValidationError, read_yaml
from speclens.acceptance.files import inside, validate
from speclens.acceptance.schema import (
    Category,
    NonEmptyStr,
    NumSpecTokens,
    Thinking,
    _Model,
)
from speclens.cost import StepCost
from speclens.runs.rundir import MAX_GPUS
from speclens.sim import catalog
from speclens.sim.roofline import Efficiency, Roofline

log = logging.getLogger(__name__)

PositiveInt = Annotated[int, Field(ge=1)]


class Speculative(_Model):
    method: NonEmptyStr
    num_spec_tokens: NumSpecTokens
    #: A roofline's drafter: a catalog model (method ``draft_model``), or how many layers of the
    #: target's width an eagle/mtp-style drafter runs.
    draft_model: NonEmptyStr | None = None
    draft_layers: Annotated[int, Field(ge=1, le=64)] = 1


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
    #: A worker's GPUs: its tensor parallel width.
    parallel: PositiveInt = 1
    #: The pool's workers (engine replicas); ``workers`` is the same field, as a disaggregated
    #: deployment's published settings name it.
    replicas: PositiveInt = Field(1, validation_alias=AliasChoices("replicas", "workers"))
    #: How many of a worker's GPUs split the routed experts (a roofline's EP; at most parallel).
    expert_parallel: PositiveInt = 1
    #: Attention data parallel over a worker's GPUs (a roofline's DP attention).
    dp_attention: bool = False
    engine: PoolEngine = Field(default_factory=PoolEngine)
    step_cost: StepCost | None = None
    step_cost_file: NonEmptyStr | None = None
    #: A roofline's efficiencies and overhead (with ``hardware`` and no step cost).
    efficiency: Efficiency | None = None

    @classmethod
    def _own_message(cls, err: Any) -> str:
        """Both spellings of the worker count are one field given twice."""
        if err["type"] == "extra_forbidden" and tuple(err["loc"]) == ("workers",):
            return "is not allowed with replicas: workers is replicas spelt another way; give one"
        return super()._own_message(err)


class Deployment(_Model):
    pools: Annotated[list[Pool], Field(min_length=1)]


#: The most lengths a workload may list (``values``): a dataset's prompts, bounded before use.
MAX_LENGTH_VALUES = 100_000


def _values_size(value: object) -> object:
    """Counted before the entries are read, so a list of ten million is refused by its length."""
    if isinstance(value, list) and len(value) > MAX_LENGTH_VALUES:
        raise ValueError(f"has {len(value):,} entries, over the limit of {MAX_LENGTH_VALUES:,}")
    if isinstance(value, list) and not value:
        raise ValueError("is empty: list at least one length")
    return value


class Lengths(_Model):
    """Token counts: fixed (``min == max``), uniform in [min, max], or ``values``: a dataset's
    own lengths, each request drawing one of them (min and max are then theirs)."""

    min: PositiveInt
    max: PositiveInt
    values: Annotated[list[PositiveInt], BeforeValidator(_values_size)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounds_of_values(cls, data: Any) -> Any:
        """``values`` alone: min and max are the values' own (either stated beside them is
        refused by the cross-check)."""
        if not isinstance(data, dict) or not isinstance(data.get("values"), list):
            return data
        values = data["values"]
        numbers = (
            [v for v in values if type(v) is int and v >= 1]
            if len(values) <= MAX_LENGTH_VALUES
            else []
        )
        bounds = {"min": min(numbers, default=1), "max": max(numbers, default=1)}
        return {**bounds, **data}  # a stated bound is kept, and refused by the cross-check

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        if data.get("values") is not None and ("min" in data or "max" in data):
            given = "min" if "min" in data else "max"
            return [((given,), "is not allowed with values: their own bounds are used")]
        return []


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
    #: The weights' precision on the hardware (``fp8``, or ``fp4``: FP4 routed experts as
    #: InferenceX runs them); None: the model entry's own dtypes.
    precision: Literal["fp8", "fp4"] | None = None
    #: The model's architecture from a file (a Hugging Face config.json or a catalog entry),
    #: instead of the catalog entry named ``model``; relative to the scenario's folder.
    model_file: NonEmptyStr | None = None
    #: The chip from a file (``speclens calibrate --host`` writes one), instead of ``hardware``.
    hardware_file: NonEmptyStr | None = None
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


def load_scenario(path: Path, precision: str | None = None) -> Scenario:
    """Read and validate a scenario file, bundle checks included; a pool priced by a roofline
    gets the KV capacity its chips hold beyond the weights, unless it states its own.
    ``precision`` (``sim --precision``) overrides the file's."""
    scenario = validate(Scenario, read_yaml(path), str(path))
    if precision is not None:
        catalog.check_precision(precision, str(path), "precision")
        scenario = scenario.model_copy(update={"precision": precision})
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
        if disaggregated(scenario) and "kv_cache_tokens" in pool.engine.model_fields_set:
            problems.append(Problem(str(path), f"deployment.pools[{index}].engine.kv_cache_tokens", (
                "is not read in a disaggregated deployment: a worker's KV capacity is its "
                "roofline's (its GPUs' memory beyond the weights); leave it out"
            )))  # fmt: skip
    problems += layout_problems(scenario, str(path))
    if problems:
        raise ValidationError(problems)
    return _with_kv_capacity(scenario, path.parent, str(path))


def disaggregated(scenario: Scenario) -> bool:
    """Whether the deployment splits prefill from decode (a pool of role prefill or decode):
    ``layout_problems`` holds it to one prefill pool and one decode pool."""
    return any(pool.role != "mixed" for pool in scenario.deployment.pools)


def layout_problems(scenario: Scenario, file: str) -> list[Problem]:
    """What the pools' layout cannot run as stated: expert parallelism wider than a worker or
    on a pool no roofline prices; a disaggregated deployment that is not one prefill pool and
    one decode pool, priced by a roofline, with only the decode pool speculating."""
    pools = scenario.deployment.pools

    def at(index: int, field: str, what: str) -> Problem:
        return Problem(file, f"deployment.pools[{index}].{field}", what)

    out = []
    for i, pool in enumerate(pools):
        if pool.expert_parallel > pool.parallel:
            out.append(at(i, "expert_parallel", (
                f"is {pool.expert_parallel}, over parallel {pool.parallel}: expert parallelism "
                "splits the experts over a worker's GPUs (at most parallel)"
            )))  # fmt: skip
        if _cost_origin(pool, scenario) != "roofline" and not disaggregated(scenario):
            for field, value in (("expert_parallel", pool.expert_parallel > 1),
                                 ("dp_attention", pool.dp_attention)):  # fmt: skip
                if value:
                    out.append(at(i, field, (
                        "prices nothing here: the pool's steps are priced by a step cost, and "
                        "expert parallelism and DP attention are a roofline's (name hardware, "
                        "without step_cost)"
                    )))  # fmt: skip
    if not disaggregated(scenario):
        return out
    roles = {r: [i for i, p in enumerate(pools) if p.role == r] for r in ("prefill", "decode")}
    for role, other in (("prefill", "decode"), ("decode", "prefill")):
        found = roles[role]
        for i in found[1:]:
            out.append(at(i, "role", (
                f"is {role}, as deployment.pools[{found[0]}] is: a disaggregated deployment has "
                "exactly one prefill pool and one decode pool"
            )))  # fmt: skip
        if found and not roles[other]:
            need = "prefills: a decode pool needs a prefill pool" if role == "decode" else (
                "decodes: a prefill pool needs a decode pool")  # fmt: skip
            out.append(at(found[0], "role", (
                f"is {role}, but no pool {need} (role: {other}); the KV cache moves from one to "
                "the other"
            )))  # fmt: skip
    for i, pool in enumerate(pools):
        if pool.role == "mixed":
            out.append(at(i, "role", (
                "is mixed in a disaggregated deployment: it has one prefill pool, one decode "
                "pool and no mixed pool"
            )))  # fmt: skip
        if pool.role == "prefill" and pool.engine.speculative is not None:
            out.append(at(i, "engine.speculative", (
                "only decode pools speculate; an acceptance value names the decode pool's K"
            )))  # fmt: skip
        for field in ("step_cost", "step_cost_file"):
            if getattr(pool, field) is not None:
                out.append(at(i, field, (
                    "is not allowed in a disaggregated deployment: its pools are priced by a "
                    "roofline (KV bytes and links come from the catalog)"
                )))  # fmt: skip
    gpus = sum(pool.parallel * pool.replicas for pool in pools)
    if gpus > MAX_GPUS:
        widest = max(range(len(pools)), key=lambda i: pools[i].parallel * pools[i].replicas)
        out.append(at(widest, "replicas", (
            f"{gpus:,} GPUs over the pools (parallel x replicas), over the {MAX_GPUS:,} a run "
            "records"
        )))  # fmt: skip
    if scenario.hardware is None and scenario.hardware_file is None:
        out.append(Problem(file, "hardware", (
            "is not set: a disaggregated deployment is priced by a roofline (KV bytes and links "
            "come from the catalog): name the chip"
        )))  # fmt: skip
    return out


def _with_kv_capacity(scenario: Scenario, base: Path, file: str) -> Scenario:
    pools, problems = [], []
    for index, pool in enumerate(scenario.deployment.pools):
        try:
            cost = pool_cost(pool, base, scenario, file, index)
        except ValidationError as exc:
            problems += exc.problems
            continue
        stated = "kv_cache_tokens" in pool.engine.model_fields_set
        if isinstance(cost, Roofline):
            found = roofline_problems(cost, pool, file, index, fit=not stated)
            if found:
                problems += found
                continue
            if not stated:
                engine = pool.engine.model_copy(update={"kv_cache_tokens": cost.kv_tokens()})
                pool = pool.model_copy(update={"engine": engine})
        pools.append(pool)
    if problems:
        raise ValidationError(problems)
    deployment = scenario.deployment.model_copy(update={"pools": pools})
    return scenario.model_copy(update={"deployment": deployment})


def roofline_problems(
    cost: Roofline, pool: Pool, file: str, index: int, fit: bool = True
) -> list[Problem]:
    """Pool ``index``'s roofline ``cost`` cannot price it: expert parallelism that does not
    divide the model's routed experts (or a model with none), and (``fit``) weights that do not
    fit in a worker's GPUs."""
    out = []
    ep, experts = pool.expert_parallel, cost.model.experts
    if ep > 1 and (experts is None or not cost.shape.moe_layers):
        out.append(Problem(file, f"deployment.pools[{index}].expert_parallel", (
            f"is {ep}, but {cost.model.name} has no routed experts to spread: leave it at 1"
        )))  # fmt: skip
    elif ep > 1 and experts is not None and experts.routed % ep:
        out.append(Problem(file, f"deployment.pools[{index}].expert_parallel", (
            f"is {ep}, which does not divide {cost.model.name}'s {experts.routed} routed experts"
        )))  # fmt: skip
    if fit and cost.kv_tokens() < 1:
        out.append(Problem(file, f"deployment.pools[{index}].parallel", (
            f"{cost.model.name}'s weights ({cost.weights_bytes() / 1e9:,.1f} GB) do not "
            f"fit in {pool.parallel} x {cost.chip.memory_gb:g} GB of {cost.chip.name} at "
            f"{cost.efficiency.memory_utilization:.0%} use: raise parallel"
        )))  # fmt: skip
    return out


def _cost_origin(pool: Pool, scenario: Scenario | None) -> str:
    """Which of its sources prices the pool: the one decision ``pool_cost`` and
    ``cost_source`` share."""
    if pool.step_cost is not None:
        return "inline"
    if pool.step_cost_file is not None:
        return "file"
    if scenario is not None and (scenario.hardware or scenario.hardware_file):
        return "roofline"
    return "default"


def pool_cost(
    pool: Pool, base: Path, scenario: Scenario | None = None, file: str = "", index: int = 0
) -> StepCostSpec | Roofline:
    """The pool's step cost: inline, from its file (relative to the scenario), a roofline of
    the scenario's model on its hardware (when it names hardware), or the default."""
    origin = _cost_origin(pool, scenario)
    if origin == "default":
        return StepCostSpec()
    if origin == "roofline":
        assert scenario is not None  # as _cost_origin found it
        return roofline(scenario, pool, base, file, index)
    if pool.step_cost is not None:  # "inline"
        return pool.step_cost
    name = str(pool.step_cost_file)  # "file"
    # Inside the scenario's folder only: a shared scenario must not read any file the user can.
    path = inside(base, name, "step_cost_file", str(base / name))
    from speclens.sim.calibrate import read_cost_file  # calibrate's output, or bare fields

    return read_cost_file(path)[0]


def cost_source(pool: Pool, scenario: Scenario | None = None) -> str:
    """Where ``pool_cost`` takes the pool's prices from, in words, for a run's output."""
    return {
        "inline": "stated in the scenario",
        "file": f"from {pool.step_cost_file}",
        "roofline": "a roofline",
        "default": "the default (no step_cost, step_cost_file or hardware)",
    }[_cost_origin(pool, scenario)]


def roofline(
    scenario: Scenario, pool: Pool, base: Path, file: str = "", index: int = 0
) -> Roofline:
    """Pool ``index``'s roofline: the scenario's model and chip (catalog names, or files inside
    the scenario's folder), its parallelism, drafter and efficiencies."""
    file = file or str(base)
    if scenario.model_file is not None:
        where = str(base / scenario.model_file)
        model = catalog.read_model(inside(base, scenario.model_file, "model_file", where))
    else:
        model = catalog.model(scenario.model, file, "model")
    model = catalog.with_precision(model, scenario.precision, file, "precision")
    if scenario.hardware_file is not None:
        where = str(base / scenario.hardware_file)
        chip = catalog.read_chip(inside(base, scenario.hardware_file, "hardware_file", where))
    else:
        chip = catalog.chip(scenario.hardware or "", file, "hardware")
    spec = pool.engine.speculative
    efficiency = pool.efficiency
    if efficiency is not None and chip.efficiency is not None:  # the pool's over the chip's
        stated = {name: getattr(efficiency, name) for name in efficiency.model_fields_set}
        efficiency = chip.efficiency.model_copy(update=stated)
    drafter = None
    if spec is not None and spec.draft_model is not None:
        where = f"deployment.pools[{index}].engine.speculative.draft_model"
        drafter = Roofline(catalog.model(spec.draft_model, file, where), chip, pool.parallel,
                           efficiency=efficiency)  # fmt: skip
    return Roofline(
        model=model,
        chip=chip,
        parallel=pool.parallel,
        method=spec.method if spec is not None else None,
        draft_layers=spec.draft_layers if spec is not None else 1,
        drafter=drafter,
        efficiency=efficiency,
        expert_parallel=pool.expert_parallel,
        dp_attention=pool.dp_attention,
    )
