"""How far to trust a prediction: the error to expect from how its steps were priced.

The figures come from one table in the package, ``registry/catalog/accuracy/inferencex.yaml``,
which ``benchmarks/inferencex.py --write-trust`` regenerates from its scoring of InferenceX's
published single-node DeepSeek-R1 runs (``tests/sim/test_trust_benchmark.py`` reruns part of it
and holds the table to it). Each error is |predicted / measured - 1| of median TPOT, median TTFT
and throughput per GPU, each deployment's median over its points, then the median over
deployments.

- Catalog defaults of a chip the data has runs of: that chip's leave-one-chip-out error (its
  points priced at defaults fitted on every other chip's points), and the fact that the
  defaults it ships were fitted on its own points (so on those points they do better).
- A chip without published points (its catalog entry ships no defaults: the roofline's global
  ones): the leave-one-chip-out median over the chips that have points, said so.
- A cost file ``calibrate`` fitted on published points: the held-out error of such a fit (the
  chip's, else the median over all), speculating or not, beside its own error on its points.
- A cost file fitted on bench runs: its own error on those runs; no held-out figure is measured.
- Efficiencies or step prices stated by hand: no error measured.

A disaggregated prediction takes the table's ``disaggregated`` figures instead (scored by
``benchmarks/inferencex_disagg.py`` on InferenceX's disaggregated runs, a configuration in place
of a deployment).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from speclens.acceptance import ValidationError, read_yaml
from speclens.acceptance.files import validate
from speclens.acceptance.schema import _Model
from speclens.sim import catalog

#: The table's file, under the catalog (shipped with the package's other catalog entries).
TABLE = ("accuracy", "inferencex.yaml")
#: Where the table's figures come from, as each statement names it.
SOURCE = "benchmarks/inferencex.py"

Rate = Annotated[float, Field(ge=0, le=1000)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]


class Errors(_Model):
    """Median |predicted / measured - 1| of each figure."""

    tpot: Rate
    ttft: Rate
    throughput: Rate


class Overall(Errors):
    """A figure's median over every scored deployment, with how many there were."""

    deployments: Count


class Speculating(Overall):
    """MTP runs: the AL inferred at the lowest concurrency, the others predicted; ``speedup``
    is the median absolute difference of predicted and measured speedup (not relative)."""

    speedup: Rate | None = None


class ChipErrors(_Model):
    """One chip's figures: its deployments and MTP-off points, its error at defaults fitted on
    the other chips, its held-out error once calibrated, and its MTP runs' (where it has some)."""

    deployments: Count
    points: Count
    uncalibrated: Errors
    held_out: Errors
    speculating: Errors | None = None
    speculating_deployments: Annotated[int, Field(ge=0, le=1_000_000)] = 0


class InferredAL(_Model):
    """The AL one published speculating deployment's lowest-concurrency TPOT implies on its
    calibrated roofline (``calibrate --acceptance-from``'s inference, run by the benchmark),
    with the range the fit's TPOT residuals give it: what a run's inferred AL is held against
    (``inferred_elsewhere``)."""

    model: str
    method: str
    chip: str
    engine: str
    precision: str
    input_tokens: Annotated[int, Field(ge=1)]
    output_tokens: Annotated[int, Field(ge=1)]
    tensor_parallel: Annotated[int, Field(ge=1)]
    expert_parallel: Annotated[int, Field(ge=1)]
    dp_attention: bool
    num_spec_tokens: Annotated[int, Field(ge=1, le=64)]
    acceptance_length: Annotated[float, Field(ge=1, le=65)]
    range: Annotated[list[Annotated[float, Field(ge=1, le=65)]], Field(min_length=2, max_length=2)]
    concurrency: Annotated[int, Field(ge=1)]
    date: str


class Disaggregated(_Model):
    """The same figures on InferenceX's disaggregated runs (``benchmarks/inferencex_disagg.py``):
    a "deployment" here is a configuration (chip, engine, precision, lengths; its layouts
    vary)."""

    held_out: Overall
    speculating: Overall | None = None
    uncalibrated: Overall
    chips: dict[str, ChipErrors]


class Accuracy(_Model):
    """The table: how it was made, the medians over all deployments, each chip's, the AL each
    speculating deployment infers, and the disaggregated runs' figures."""

    kind: Literal["Accuracy"] = "Accuracy"
    source: str
    error: str
    held_out: Overall
    speculating: Speculating
    uncalibrated: Overall
    chips: dict[str, ChipErrors]
    inferred_acceptance: list[InferredAL] = Field(default_factory=list)
    disaggregated: Disaggregated | None = None


def table_path() -> Path:
    return catalog.catalog_dir(TABLE[0]) / TABLE[1]


def read_table(path: Path) -> Accuracy:
    """The accuracy table at ``path``, validated (every problem at once, located by field)."""
    return validate(Accuracy, read_yaml(path), str(path))


@functools.cache
def table() -> Accuracy:
    """The shipped accuracy table."""
    return read_table(table_path())


def inferred_elsewhere(
    model: str, method: str, accuracy: Accuracy | None = None
) -> list[InferredAL]:
    """The ALs the table's deployments infer for ``model`` speculating with ``method``."""
    accuracy = accuracy or table()
    return [e for e in accuracy.inferred_acceptance if (e.model, e.method) == (model, method)]


@dataclass(frozen=True)
class Trust:
    """What to expect of a prediction's error: ``expected`` (TPOT, TTFT, throughput per GPU:
    None where nothing measured it), on what ``basis``, the fit's ``own`` error on what it was
    fitted on (None where it was not fitted), and ``line``: all of it in one sentence."""

    basis: str
    line: str
    chip: str | None = None
    expected: Errors | None = None
    own: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json`` and a written run's provenance; a report draws ``expected`` as a band
        (predicted x (1 +- error))."""
        return {
            "basis": self.basis,
            "chip": self.chip,
            "expected_error": None if self.expected is None else self.expected.model_dump(),
            "own_error": dict(self.own) or None,
            "source": SOURCE if self.expected is not None else None,
            "line": self.line,
        }

    def band(self, figure: str, predicted: float) -> tuple[float, float] | None:
        """``predicted``'s band (``figure``: tpot, ttft or throughput), or None unmeasured:
        predicted / (1 + e) to predicted x (1 + e), symmetric on the log scale as compare's
        band of a predicted input is (``runs.compare_decide.reading``), and never below 0."""
        if self.expected is None:
            return None
        error = float(getattr(self.expected, figure))
        return predicted / (1.0 + error), predicted * (1.0 + error)


def percent(value: float) -> str:
    """An error as the table's figures are read: two digits (5.0%, 20%)."""
    return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"


def _figures(errors: Errors) -> str:
    return (f"TPOT {percent(errors.tpot)}, TTFT {percent(errors.ttft)}, throughput per GPU "
            f"{percent(errors.throughput)}")  # fmt: skip


def _fitted_on(chip: str) -> catalog.FittedOn | None:
    """What a catalog chip's defaults were fitted on (None: a chip from a file, or none)."""
    return catalog.chip(chip).fitted_on if chip in catalog.names("chips") else None


def _ships_defaults(chip: str) -> bool:
    return chip in catalog.names("chips") and catalog.chip(chip).efficiency is not None


def for_chip(chip: str, accuracy: Accuracy | None = None, disaggregated: bool = False) -> Trust:
    """A roofline at the catalog defaults of ``chip`` (a catalog name); ``disaggregated``: the
    prediction is of a disaggregated deployment, scored on those runs."""
    accuracy = accuracy or table()
    if disaggregated:
        return _disaggregated_chip(chip, accuracy)
    entry = accuracy.chips.get(chip)
    if entry is not None and _ships_defaults(chip):
        return Trust("catalog defaults", f"expected error {_figures(entry.uncalibrated)} "
                     f"({chip}'s catalog defaults, {SOURCE} leave-one-chip-out: defaults fitted "
                     f"on the other chips' published points, scored on {chip}'s "
                     f"{entry.deployments} deployments; {chip}'s shipped defaults were fitted "
                     f"on {chip} itself, those {entry.points} points)", chip,
                     entry.uncalibrated)  # fmt: skip
    overall = Errors(**accuracy.uncalibrated.model_dump(exclude={"deployments"}))
    fitted = _fitted_on(chip)
    if fitted is not None and fitted.runs == "disaggregated":
        return Trust("no published points", f"expected error {_figures(overall)} (no "
                     f"single-node points for {chip}: the median over the other chips' {SOURCE} "
                     f"leave-one-chip-out errors, {accuracy.uncalibrated.deployments} "
                     f"deployments, a guide only: {chip}'s defaults were fitted on its "
                     f"{fitted.points} disaggregated points, scored on no single-node one)",
                     chip, overall)  # fmt: skip
    return Trust("no published points", f"expected error {_figures(overall)} (no published "
                 f"points for {chip}: the median over the other chips' {SOURCE} "
                 f"leave-one-chip-out errors, {accuracy.uncalibrated.deployments} deployments, a "
                 f"guide only: {chip} prices at the roofline's global defaults, fitted on no "
                 "chip and scored on none)", chip,
                 overall)  # fmt: skip


def _disaggregated_chip(chip: str, accuracy: Accuracy) -> Trust:
    """``for_chip`` of a disaggregated prediction: the chip's leave-one-chip-out error on its
    disaggregated configurations, else the median over the chips that have some."""
    block = accuracy.disaggregated
    if block is None:
        return Trust("unmeasured", f"expected error not measured (no disaggregated run was "
                     f"scored for {chip})", chip)  # fmt: skip
    entry = block.chips.get(chip)
    fitted = _fitted_on(chip)
    own = (f"; {chip}'s shipped defaults were fitted on its own {fitted.runs} runs, "
           f"{fitted.points} points" if fitted is not None else "")  # fmt: skip
    if entry is not None:
        return Trust("catalog defaults", f"expected error {_figures(entry.uncalibrated)} "
                     f"({chip}'s catalog defaults on disaggregated runs, {SOURCE} "
                     f"leave-one-chip-out: defaults fitted on the other chips' disaggregated "
                     f"points, scored on {chip}'s {entry.deployments} configurations{own})",
                     chip, entry.uncalibrated)  # fmt: skip
    overall = Errors(**block.uncalibrated.model_dump(exclude={"deployments"}))
    return Trust("no published points", f"expected error {_figures(overall)} (no disaggregated "
                 f"points for {chip}: the median over the other chips' {SOURCE} "
                 f"leave-one-chip-out errors, {block.uncalibrated.deployments} configurations, "
                 "a guide only)", chip, overall)  # fmt: skip


#: The own-error fields each kind of fit writes (calibrate on published points, on bench runs).
POINT_ERRORS = {"tpot": "tpot_error_median", "ttft": "ttft_error_median",
                "throughput": "throughput_error_median"}  # fmt: skip
RUN_ERROR = "decode_time_error_median"


def _rate(fit: dict[str, Any], key: str, source: str) -> float | None:
    value = fit.get(key)
    if value is None:
        return None
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0):  # fmt: skip
        raise ValidationError.single(f"fit.{key}", f"expected a fraction >= 0 (what calibrate "
                                     f"writes), got {value!r}", source)  # fmt: skip
    return float(value)


def for_cost_file(
    meta: dict[str, Any], source: str, speculating: bool = False,
    accuracy: Accuracy | None = None, disaggregated: bool = False,
) -> Trust:  # fmt: skip
    """A cost file ``calibrate`` wrote (``meta``: ``read_cost_file``'s, with ``fit`` and
    ``provenance``), ``source`` its name for errors; ``speculating``: the prediction runs
    speculation at an inferred AL."""
    accuracy = accuracy or table()
    fit: dict[str, Any] = meta["fit"] if isinstance(meta.get("fit"), dict) else {}
    provenance = meta["provenance"] if isinstance(meta.get("provenance"), dict) else {}
    chip = provenance.get("hardware") if isinstance(provenance.get("hardware"), str) else None
    own = {name: _rate(fit, key, source) for name, key in POINT_ERRORS.items()}
    if all(v is not None for v in own.values()):
        points = fit.get("load_points")
        count = f"{len(points)} " if isinstance(points, list) else ""
        mine = {k: float(v) for k, v in own.items() if v is not None}
        expected, where = _held_out(accuracy, chip, speculating, disaggregated)
        how = ("speculating, the AL inferred at one concurrency and the others predicted"
               if speculating else "a fit on a deployment's other concurrencies predicting the "
               "one left out")  # fmt: skip
        return Trust("calibrated on published points", f"expected error {_figures(expected)} "
                     f"(held out, {SOURCE}: {how}, {where}); on its own {count}points "
                     f"{_figures(Errors(**mine))}", chip, expected, mine)  # fmt: skip
    decode = _rate(fit, RUN_ERROR, source)
    if decode is not None:
        return Trust("calibrated on bench runs", f"expected error not measured held out (a fit "
                     f"on bench runs); on the runs it was fitted on, median decode time "
                     f"{percent(decode)}", chip, None, {"decode_time": decode})  # fmt: skip
    return Trust("unmeasured fit", f"expected error not measured ({source}'s fit records no "
                 "error, on what it was fitted on or held out)", chip)  # fmt: skip


def _held_out(accuracy: Accuracy, chip: str | None, speculating: bool,
              disaggregated: bool = False) -> tuple[Errors, str]:  # fmt: skip
    block = accuracy.disaggregated
    if disaggregated and block is not None:
        entry_d = block.chips.get(chip) if chip else None
        if entry_d is not None and not speculating:
            return entry_d.held_out, (f"median over {chip}'s {entry_d.deployments} "
                                      "disaggregated configurations")  # fmt: skip
        if entry_d is not None and entry_d.speculating is not None:
            return entry_d.speculating, (f"median over {chip}'s "
                                         f"{entry_d.speculating_deployments} disaggregated "
                                         "configurations with MTP runs")  # fmt: skip
        over = block.speculating if speculating and block.speculating else block.held_out
        return Errors(**over.model_dump(include={"tpot", "ttft", "throughput"})), (
            f"median over {over.deployments} disaggregated configurations of every chip"
        )
    entry = accuracy.chips.get(chip) if chip else None
    if entry is not None and not speculating:
        return entry.held_out, f"median over {chip}'s {entry.deployments} deployments"
    if entry is not None and entry.speculating is not None:
        return entry.speculating, (f"median over {chip}'s {entry.speculating_deployments} "
                                   "deployments with MTP runs")  # fmt: skip
    overall = accuracy.speculating if speculating else accuracy.held_out
    return Errors(**overall.model_dump(include={"tpot", "ttft", "throughput"})), (
        f"median over {overall.deployments} deployments of every chip"
    )


def for_pricing(
    pricing: dict[str, Any], meta: dict[str, Any] | None = None, speculating: bool = False,
    accuracy: Accuracy | None = None, disaggregated: bool = False,
) -> Trust:  # fmt: skip
    """What prices a pool's steps (its ``describe()``, as a sim run's ``pricing`` holds it, with
    ``source``), and where it came from a cost file ``calibrate`` wrote, that file's ``meta``;
    ``disaggregated``: the prediction is of a disaggregated deployment."""
    if meta and isinstance(meta.get("fit"), dict):
        where = str(pricing.get("source") or "the cost file").removeprefix("from ")
        return for_cost_file(meta, where, speculating, accuracy, disaggregated)
    chip = pricing.get("chip")
    if pricing.get("kind") == "roofline" and isinstance(chip, str):
        origin = pricing.get("efficiency_source")
        if origin == "chip" or (origin == "default" and not _ships_defaults(chip)):
            return for_chip(chip, accuracy, disaggregated)
        return Trust("stated", f"expected error not measured (efficiencies stated for {chip}, "
                     "not its catalog defaults: no benchmark scored them)", chip)  # fmt: skip
    source = pricing.get("source") or "the step cost"
    return Trust("stated", f"expected error not measured (step prices {source}: no benchmark "
                 "scored them)")  # fmt: skip
