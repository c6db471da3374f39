"""Pydantic models of the acceptance files: profile sets, profiles, provenance, inline values and
the scenario pin, with every check of the specification.

Each model collects *every* problem it finds: pydantic's own field errors plus the cross-field
checks of ``_cross_checks`` (which see the raw mapping, so one bad field never hides another).
Messages are speclens's own; ``speclens.acceptance.files`` turns them into
``<file>: <path.to.field>: <what is wrong>`` lines.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable
from datetime import date
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from speclens.acceptance.errors import UNRECOGNIZED_KEY
from speclens.acceptance.quantity import (
    MAX_NUM_SPEC_TOKENS,
    is_finite_number,
    length_from_rate,
    length_problems,
    num_spec_tokens_problem,
    rate_problems,
    rates_shape_problems,
    rates_sum_problem,
)
from speclens.acceptance.spread import (
    LEVEL_NAMES,
    MAX_TOLERANCE,
    MIN_REQUESTS,
    quantile_problems,
)

Loc = tuple[str | int, ...]
ThinkingMode = Literal["on", "off"]
#: How a profile's value was obtained. ``not_charged`` exists for deployments, never in a profile.
#: ``inferred``: derived from a run that did not count it (``calibrate --acceptance-from``: the AL a
#: run's TPOT implies, and the AL at other K from ``acceptance.curve``'s model).
METHODS = ("measured", "inferred", "copied", "assumed", "not_charged")
PROFILE_METHODS = ("measured", "inferred", "copied", "assumed")
CATEGORY_PATTERN = r"^[a-z0-9_-]+$"
_CATEGORY_RE = re.compile(CATEGORY_PATTERN)


# --------------------------------------------------------------------------- error plumbing
def _error(loc: Loc, message: str, value: object = None) -> InitErrorDetails:
    return {
        "type": _fail(message),
        "loc": loc,
        "input": value,
    }


_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "nothing (null)",
}
#: Longest value quoted in a message; a longer one is described by its kind alone.
_SHOWN = 40
_REPR = reprlib.Repr()  # keyword arguments need Python 3.12
_REPR.maxstring = _REPR.maxother = _SHOWN


def _show(value: object) -> str:
    """A repr cut to about ``_SHOWN`` characters, cheap for any input (a value can be a
    4 MiB string or a list shared thousands of times through YAML aliases)."""
    return _REPR.repr(value)


def _describe(value: object) -> str:
    """``value``'s kind, with the value itself only when it is a short scalar. The type is
    checked first, so a huge list or mapping is never rendered."""
    kind = _KINDS.get(type(value), type(value).__name__)
    if isinstance(value, str) and len(value) > _SHOWN:
        return kind
    if not isinstance(value, bool | int | float | str | date | type(None)):
        return kind
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return kind  # repr of a huge int is slow, and refused past 4,300 digits
    text = repr(value)
    return kind if len(text) > _SHOWN else f"{kind} ({text})"


_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "bool_type": "true or false",
}


def _message(err: Any) -> str:
    """Our wording of a pydantic error, capped in length: pydantic's own text may quote input."""
    text = _wording(err)
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


#: Longest problem message; anything past it is input quoted back, not information.
_MESSAGE_LIMIT = 300


def _wording(err: Any) -> str:
    kind = err["type"]
    if kind == "speclens":
        return str(err["msg"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return UNRECOGNIZED_KEY
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_describe(err.get('input'))}"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"expected {expected}, got {_describe(err.get('input'))}"
    if kind == "value_error":
        return str(err.get("ctx", {}).get("error", err["msg"]))
    return f"{err['msg']} (got {_describe(err.get('input'))})"


class _Model(BaseModel):
    """Strict, closed, immutable; reports every problem at once."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[Loc, str]]:
        """Problems that involve more than one field, read off the raw mapping."""
        return []

    @classmethod
    def _own_message(cls, err: Any) -> str:
        """An unknown key of this model's own mapping lists the keys it expects."""
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            return f"{UNRECOGNIZED_KEY}: expected one of {', '.join(cls.model_fields)}"
        return _message(err)

    @model_validator(mode="wrap")
    @classmethod
    def _collect_every_problem(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        errors: list[InitErrorDetails] = []
        value = None
        try:
            value = handler(data)
        except PydanticValidationError as exc:
            errors = [_error(e["loc"], cls._own_message(e), e.get("input")) for e in exc.errors()]
        if isinstance(data, dict):
            errors += [_error(loc, msg) for loc, msg in cls._cross_checks(data)]
        if errors:
            raise PydanticValidationError.from_exception_data(cls.__name__, errors)
        return value


# --------------------------------------------------------------------------- field types
def _fail(message: str) -> PydanticCustomError:
    """A field error whose text is exactly ``message``."""
    return PydanticCustomError("speclens", "{message}", {"message": message})


def _non_empty(value: str) -> str:
    if not value.strip():
        raise _fail("must not be empty")
    return value


def _at_least(minimum: int) -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < minimum:
            if minimum == 0:
                raise _fail(f"must not be negative, got {value}")
            raise _fail(f"must be at least {minimum}, got {value}")
        return value

    return check


def _not_negative_number(value: float) -> float:
    if not is_finite_number(value) or value < 0:
        raise _fail(f"must be a finite number >= 0, got {value}")
    return value


def _top_p(value: float) -> float:
    if not (is_finite_number(value) and 0 < value <= 1):
        raise _fail(f"{value:g} lies outside (0, 1]")
    return value


def _finite_at_least_one(value: float) -> float:
    if not is_finite_number(value):
        raise _fail(f"must be a finite number, got {value}")
    if value < 1:
        raise _fail(f"{value:g} lies below 1")
    return value


def _num_spec_tokens(value: int) -> int:
    problem = num_spec_tokens_problem(value)
    if problem:
        raise _fail(problem)
    return value


def _rates_length(value: object) -> object:
    """Checked before the entries, so a list of a million rates is refused by its length."""
    if isinstance(value, list) and len(value) > MAX_NUM_SPEC_TOKENS:
        raise _fail(
            f"has {len(value):,} entries, over the limit of {MAX_NUM_SPEC_TOKENS} (one per draft "
            f"position, K <= {MAX_NUM_SPEC_TOKENS})"
        )
    return value


def _rate(value: float) -> float:
    problems = rate_problems(value)
    if problems:
        raise _fail(problems[0])
    return value


def _draft_coverage(value: object) -> object:
    """Checked before pydantic's own type check, so every wrong value reads the same way."""
    if not (is_finite_number(value) and 0 < value <= 1):  # type: ignore[operator]
        raise _fail(f"expected a number in (0, 1], got {_describe(value)}")
    return float(value)  # type: ignore[arg-type]


def _category(value: str) -> str:
    if not _CATEGORY_RE.fullmatch(value):
        raise _fail(f"{_show(value)} is malformed: use lower-case letters, digits, '_' and '-'")
    return value


def _thinking(value: object) -> object:
    if isinstance(value, bool):
        raise _fail(
            "expected 'on' or 'off', got a boolean: YAML reads a bare on/off as true/false, "
            'so quote it (thinking: "on")'
        )
    return value


def _method(value: object) -> object:
    if value == "not_charged":
        raise _fail(
            f"'not_charged' is refused in a profile: use {', '.join(PROFILE_METHODS[:-1])} or "
            f"{PROFILE_METHODS[-1]}"
        )
    if value not in PROFILE_METHODS:
        raise _fail(f"expected one of {', '.join(PROFILE_METHODS)}, got {_describe(value)}")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]
NumSpecTokens = Annotated[
    int,
    AfterValidator(_num_spec_tokens),
    Field(
        description=f"K, in [1, {MAX_NUM_SPEC_TOKENS}].",
        json_schema_extra={"minimum": 1, "maximum": MAX_NUM_SPEC_TOKENS},
    ),
]
NonNegativeInt = Annotated[int, AfterValidator(_at_least(0))]
Category = Annotated[str, AfterValidator(_category), Field(pattern=CATEGORY_PATTERN)]
Thinking = Annotated[ThinkingMode, BeforeValidator(_thinking)]
AcceptanceLength = Annotated[float, AfterValidator(_finite_at_least_one)]
Rate = Annotated[float, AfterValidator(_rate), Field(ge=0, le=1)]
#: K per-position rates; at most ``MAX_NUM_SPEC_TOKENS`` of them, counted before they are read.
Rates = Annotated[
    list[Rate],
    BeforeValidator(_rates_length),
    Field(json_schema_extra={"maxItems": MAX_NUM_SPEC_TOKENS}),
]
#: The share of decode request-steps that drafted at all (an n-gram drafter often finds no match).
#: AL counts only the steps that drafted; absent means 1.0, as for forced and model drafters.
DraftCoverage = Annotated[
    float,
    Field(
        gt=0,
        le=1,
        description="The share of decode steps that drafted, in (0, 1]; AL counts only those. "
        "Absent: 1.0.",
    ),
    BeforeValidator(_draft_coverage),  # after Field: the schema keeps the JSON Schema bounds
]
ProfileMethod = Annotated[
    Literal["measured", "inferred", "copied", "assumed"], BeforeValidator(_method)
]


def _number(value: object) -> float | None:
    """``value`` as a float when it is a real, finite number (never a bool), else None."""
    return float(value) if is_finite_number(value) else None  # type: ignore[arg-type]


def _given(data: dict[str, Any], name: str) -> bool:
    """A key counts as given only with a value: ``key:`` with nothing after it (null) is missing."""
    return data.get(name) is not None


def _k(data: dict[str, Any]) -> int | None:
    k = data.get("num_spec_tokens")
    return k if num_spec_tokens_problem(k) is None else None


def _rates_checks(data: dict[str, Any], k: int | None) -> list[tuple[Loc, str]]:
    """Count and monotonicity of ``per_position_rates`` (entries are checked field by field)."""
    rates = data.get("per_position_rates")
    if not isinstance(rates, list) or len(rates) > MAX_NUM_SPEC_TOKENS:
        return []  # the field reports an overlong list
    return [(("per_position_rates",), p.message) for p in rates_shape_problems(rates, k)]


def _valid_rates(data: dict[str, Any], k: int | None) -> list[float] | None:
    rates = data.get("per_position_rates")
    if not isinstance(rates, list) or _rates_checks(data, k):
        return None
    numbers = [_number(r) for r in rates]
    if any(n is None or not 0 <= n <= 1 for n in numbers):
        return None
    return [float(n) for n in numbers if n is not None]


def _length_range(data: dict[str, Any], k: int | None) -> list[tuple[Loc, str]]:
    length = _number(data.get("acceptance_length"))
    if k is None or length is None or length < 1:
        return []  # a missing, mistyped or sub-1 value is reported by its field
    return [(("acceptance_length",), m) for m in length_problems(length, k)]


# --------------------------------------------------------------------------- spread
def _tolerance(value: float) -> float:
    if not (is_finite_number(value) and 0 < value <= MAX_TOLERANCE):
        raise _fail(f"expected a number in (0, {MAX_TOLERANCE:g}], got {_describe(value)}")
    return value


def _quantile_map(value: object) -> object:
    """The names are checked before the entries, so a mapping of a million keys is refused by
    its size, and a misspelt level is named."""
    if not isinstance(value, dict):
        return value
    if len(value) > 4 * len(LEVEL_NAMES):
        raise _fail(f"has {len(value):,} entries: expected the {len(LEVEL_NAMES)} levels "
                    f"{', '.join(LEVEL_NAMES)}")  # fmt: skip
    names = [str(k) for k in value]
    unknown = [_show(n) for n in names if n not in LEVEL_NAMES]
    missing = [n for n in LEVEL_NAMES if n not in value]
    if unknown or missing:
        parts = ([f"unknown level {', '.join(unknown)}"] if unknown else []) + (
            [f"missing {', '.join(missing)}"] if missing else []
        )
        raise _fail(f"{'; '.join(parts)}: expected exactly {', '.join(LEVEL_NAMES)}")
    bad = [f"{n} {_describe(v)}" for n, v in value.items() if not is_finite_number(v)]
    if bad:
        raise _fail(f"expected a finite number at each level, got {', '.join(bad)}")
    return value


def spread_values(data: object) -> list[float] | None:
    """A raw spread mapping's quantiles in level order, or None when they are not all numbers."""
    if not isinstance(data, dict):
        return None
    quantiles = data.get("quantiles")
    if not isinstance(quantiles, dict) or any(n not in quantiles for n in LEVEL_NAMES):
        return None
    numbers = [_number(quantiles[n]) for n in LEVEL_NAMES]
    return None if any(n is None for n in numbers) else [float(n) for n in numbers if n is not None]


class AcceptanceSpread(_Model):
    """Acceptance's spread between requests: the per-request AL's quantiles, each request weighted
    by its verify steps (so their mean is the pooled AL), and how many requests they rest on."""

    num_spec_tokens: NumSpecTokens
    quantiles: Annotated[dict[str, float], BeforeValidator(_quantile_map)] = Field(
        description=f"Per-request AL at the levels {', '.join(LEVEL_NAMES)}, weighted by verify "
        "steps; non-decreasing, each in [1, K + 1]."
    )
    requests: Annotated[int, AfterValidator(_at_least(MIN_REQUESTS))] = Field(
        description=f"The requests the quantiles rest on; at least {MIN_REQUESTS}."
    )
    tolerance: Annotated[float, AfterValidator(_tolerance)] | None = Field(
        None,
        description="How far the quantiles' implied mean may sit from the AL it accompanies "
        "(default 0.05).",
    )
    source: NonEmptyStr | None = Field(None, description="The run the spread was measured on.")

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[Loc, str]]:
        values = spread_values(data)
        if values is None:
            return []
        return [(("quantiles",), m) for m in quantile_problems(values, _k(data), None, None)]

    @property
    def values(self) -> list[float]:
        """The quantiles in level order (``spread.LEVELS``)."""
        return [self.quantiles[n] for n in LEVEL_NAMES]


def _spread_against(data: dict[str, Any], length: float | None) -> list[tuple[Loc, str]]:
    """A spread beside an AL: at the same K, its implied mean within its tolerance of the AL."""
    spread = data.get("spread")
    if not isinstance(spread, dict):
        return []
    k, spread_k = _k(data), _k(spread)
    if k is not None and spread_k is not None and spread_k != k:
        return [(("spread", "num_spec_tokens"),
                 f"is {spread_k}, but the value it spreads is stated at K {k}: a spread is "
                 "refused at another K, never rescaled")]  # fmt: skip
    values = spread_values(spread)
    tolerance = _number(spread.get("tolerance"))
    if values is None or length is None or k is None:
        return []
    if quantile_problems(values, k, None, None):
        return []  # the spread reports its own problems
    return [(("spread", "quantiles"), m) for m in quantile_problems(values, k, length, tolerance)]


# --------------------------------------------------------------------------- provenance
class Sampling(_Model):
    """The decoding configuration a value was measured under."""

    temperature: Annotated[float, AfterValidator(_not_negative_number)] = Field(
        description="Not negative. 0 is greedy decoding."
    )
    top_p: Annotated[float, AfterValidator(_top_p)] | None = Field(None, description="In (0, 1].")
    top_k: Annotated[int, AfterValidator(_at_least(-1))] | None = Field(
        None, description="At least -1; -1 and 0 disable it."
    )
    max_tokens: NonNegativeInt | None = Field(None, description="Output cap. Not negative.")


def _settings(value: dict[str, Any]) -> dict[str, Any]:
    for name, setting in value.items():
        if (
            not str(name).strip()
            or setting is None
            or setting == ""
            or setting == []
            or setting == {}
        ):
            raise _fail(f"setting {_show(name)} is empty")
    return value


class Provenance(_Model):
    """Where a value was measured. ``hardware``, ``engine_image`` and ``sampling`` are required
    when the profile's method is ``measured`` (checked by the profile, which knows the method)."""

    source: NonEmptyStr = Field(description="The document the value was read from.")
    run: NonEmptyStr | None = Field(None, description="The job that measured it.")
    benchmark: NonEmptyStr | None = Field(None, description="The prompt set.")
    prompts: NonNegativeInt | None = Field(None, description="How many prompts it covered.")
    hardware: NonEmptyStr | None = Field(None, description="The catalog chip it was measured on.")
    engine_image: NonEmptyStr | None = Field(None, description="The engine image or release.")
    tp: NonNegativeInt | None = Field(None, description="The tensor-parallel width.")
    sampling: Sampling | None = None
    settings: Annotated[dict[str, Any], AfterValidator(_settings)] | None = Field(
        None, description="Other engine settings that bear on acceptance, by name."
    )


MEASURED_PROVENANCE = ("hardware", "engine_image", "sampling")


# --------------------------------------------------------------------------- profiles
class ProfileKey(BaseModel):
    """What a profile is looked up by."""

    model_config = ConfigDict(frozen=True)

    model: str
    speculative_method: str
    num_spec_tokens: NumSpecTokens
    thinking: str
    category: str

    def __str__(self) -> str:
        """The ``copied_from`` spelling: model/method/k<K>/thinking-<mode>/category."""
        return (
            f"{self.model}/{self.speculative_method}/k{self.num_spec_tokens}/"
            f"thinking-{self.thinking}/{self.category}"
        )


COPIED_FROM_PATTERN = r"^[^/\s]+/[^/\s]+/k(?P<k>[1-9][0-9]*)/thinking-(on|off)/[a-z0-9_-]+$"


def _copied_from(value: str) -> str:
    match = re.fullmatch(COPIED_FROM_PATTERN, value)
    if not match:
        raise _fail(f"{_show(value)} is not model/method/k<K>/thinking-<on|off>/category")
    digits = match["k"]
    if len(digits) > len(str(MAX_NUM_SPEC_TOKENS)) or int(digits) > MAX_NUM_SPEC_TOKENS:
        shown = digits if len(digits) <= _SHOWN else f"of {len(digits):,} digits"
        raise _fail(f"names K {shown}: K must be at most {MAX_NUM_SPEC_TOKENS}")
    return value


class Profile(_Model):
    """One acceptance length, keyed by model, speculative method, K, thinking mode and category."""

    model: NonEmptyStr = Field(description="The catalog model name.")
    speculative_method: NonEmptyStr = Field(description="The engine's speculative method name.")
    num_spec_tokens: NumSpecTokens
    thinking: Thinking
    category: Category = Field(description="The workload category, such as coding.")
    acceptance_length: AcceptanceLength = Field(description="AL, in [1, K + 1].")
    per_position_rates: Rates | None = Field(
        None, description="K rates, each in [0, 1], non-increasing, summing to AL - 1 within 0.01."
    )
    draft_coverage: DraftCoverage | None = None
    spread: AcceptanceSpread | None = Field(
        None, description="The per-request AL's spread around acceptance_length (measured)."
    )
    method: ProfileMethod = Field(description="How the value was obtained.")
    provenance: Provenance | None = Field(None, description="Required unless method is assumed.")
    rationale: NonEmptyStr | None = Field(None, description="Required unless method is measured.")
    copied_from: Annotated[str, AfterValidator(_copied_from)] | None = Field(
        None, description="Required with method copied: model/method/k<K>/thinking-<mode>/category."
    )

    @property
    def key(self) -> ProfileKey:
        return ProfileKey(
            model=self.model,
            speculative_method=self.speculative_method,
            num_spec_tokens=self.num_spec_tokens,
            thinking=self.thinking,
            category=self.category,
        )

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[Loc, str]]:
        k = _k(data)
        problems = _length_range(data, k) + _rates_checks(data, k)
        rates, length = _valid_rates(data, k), _number(data.get("acceptance_length"))
        if rates is not None and length is not None:
            mismatch = rates_sum_problem(rates, length)
            if mismatch:
                problems.append((("per_position_rates",), mismatch))
        problems += _spread_against(data, length)
        method = data.get("method")
        if method not in PROFILE_METHODS:
            return problems  # the method field reports it; its requirements are unknown
        if method != "assumed" and not _given(data, "provenance"):
            problems.append((("provenance",), f"is required with method {method}"))
        if method != "measured" and not _given(data, "rationale"):
            problems.append((("rationale",), f"is required with method {method}"))
        if method == "copied" and not _given(data, "copied_from"):
            problems.append((("copied_from",), "is required with method copied"))
        provenance = data.get("provenance")
        if method == "measured" and isinstance(provenance, dict):
            for name in MEASURED_PROVENANCE:
                if not _given(provenance, name):
                    problems.append((("provenance", name), "is required with method measured"))
        return problems


def profile_key_of(data: object) -> ProfileKey | None:
    """The key of a raw profile mapping, or None when its key fields are not all well-typed."""
    if not isinstance(data, dict):
        return None
    fields = ("model", "speculative_method", "thinking", "category")
    if not all(isinstance(data.get(f), str) for f in fields) or _k(data) is None:
        return None
    return ProfileKey(**{f: data[f] for f in (*fields, "num_spec_tokens")})


class AcceptanceProfileSet(_Model):
    """A registry file under ``acceptance/``: named acceptance profiles with their provenance."""

    KIND: ClassVar[str] = "AcceptanceProfileSet"

    kind: Literal["AcceptanceProfileSet"] = Field(description="Always AcceptanceProfileSet.")
    name: NonEmptyStr = Field(description="The set's identity; by convention its file name.")
    caveats: list[NonEmptyStr] | None = Field(
        None, description="What the set does not cover and how far its values travel."
    )
    profiles: Annotated[list[Profile], Field(min_length=1)]

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[Loc, str]]:
        problems: list[tuple[Loc, str]] = []
        profiles = data.get("profiles")
        if isinstance(profiles, list) and not profiles:
            problems.append((("profiles",), "has no profiles: at least one is required"))
        if not isinstance(profiles, list):
            return problems
        seen: dict[ProfileKey, int] = {}
        for i, raw in enumerate(profiles):
            key = profile_key_of(raw)
            if key is None:
                continue
            if key in seen:
                problems.append(
                    ((("profiles", i)), f"repeats the key {key} of profiles[{seen[key]}]")
                )
            else:
                seen[key] = i
        return problems

    def find(self, key: ProfileKey) -> Profile | None:
        """The profile with ``key``, if this set has one."""
        return next((p for p in self.profiles if p.key == key), None)


# --------------------------------------------------------------------------- inline values, pins
class AcceptanceValue(_Model):
    """An acceptance value stated inline (workload, scenario pin, command line), for one K."""

    num_spec_tokens: NumSpecTokens
    acceptance_length: AcceptanceLength | None = Field(None, description="AL, in [1, K + 1].")
    acceptance_rate: Rate | None = Field(None, description="(AL - 1) / K, in [0, 1].")
    per_position_rates: Rates | None = Field(None, description="K rates, as for a profile.")
    draft_coverage: DraftCoverage | None = None
    spread: AcceptanceSpread | None = Field(
        None, description="The per-request AL's spread around the value."
    )
    source: NonEmptyStr | None = Field(None, description="Where the value came from.")

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[Loc, str]]:
        stated = [
            f
            for f in ("acceptance_length", "acceptance_rate", "per_position_rates")
            if _given(data, f)
        ]
        if not stated:
            return [
                (
                    (),
                    "states no acceptance: give acceptance_length, acceptance_rate or per_position_rates",
                )
            ]
        k = _k(data)
        problems = _length_range(data, k) + _rates_checks(data, k)
        if _given(data, "acceptance_length") and _given(data, "acceptance_rate"):
            problems.append(
                (("acceptance_rate",), "is not allowed with acceptance_length: state one")
            )
        rates = _valid_rates(data, k)
        length = _number(data.get("acceptance_length"))
        rate = _number(data.get("acceptance_rate"))
        if length is None and rate is not None and k is not None and not rate_problems(rate):
            length = length_from_rate(rate, k)
        if rates is not None and length is not None:
            mismatch = rates_sum_problem(rates, length)
            if mismatch:
                problems.append(
                    (("per_position_rates",), f"disagree with the stated value: {mismatch}")
                )
        if length is None and rates is not None:
            length = 1.0 + math.fsum(rates)
        return problems + _spread_against(data, length)

    @property
    def length(self) -> float:
        """The AL this value states, whichever spelling it used."""
        if self.acceptance_length is not None:
            return self.acceptance_length
        if self.acceptance_rate is not None:
            return length_from_rate(self.acceptance_rate, self.num_spec_tokens)
        assert self.per_position_rates is not None  # guaranteed by validation
        return round(1.0 + math.fsum(self.per_position_rates), 12)


class AcceptancePin(_Model):
    """A scenario's ``acceptance`` key: an inline value, or a profile set (with a fallback)."""

    profiles: NonEmptyStr | None = Field(
        None, description="A profile set in the registry, consulted in place of the default."
    )
    value: AcceptanceValue | None = Field(None, description="An inline value.")
    fallback_category: Category | None = Field(
        None, description="The category to use when the workload's has no curve."
    )

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[Loc, str]]:
        if not any(_given(data, k) for k in ("profiles", "value", "fallback_category")):
            return [((), "sets nothing: give value, or profiles and/or fallback_category")]
        problems: list[tuple[Loc, str]] = []
        if _given(data, "value") and _given(data, "profiles"):
            problems.append((("profiles",), "is not allowed with value: set one"))
        if _given(data, "value") and _given(data, "fallback_category"):
            problems.append((("fallback_category",), "is not allowed with value"))
        return problems


class WorkloadAcceptance(_Model):
    """A workload's acceptance terms: its thinking mode, category and optional inline value."""

    thinking: Thinking | None = None
    category: Category | None = None
    acceptance: AcceptanceValue | None = None
