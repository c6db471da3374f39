"""What every built-in adapter shares: strict field reading, the usage and n > 1 rules, and a base
class that turns any failure into ``None`` plus a reason.

The wire is untrusted JSON, so every reader checks the type it gets (a count must be a JSON
integer, a ratio a finite number) and raises ``Malformed`` with the field's path otherwise;
nothing is coerced, because a payload of the wrong type is one we do not understand.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeGuard

import pydantic

from speclens.acceptance import acceptance_length
from speclens.runs.record import DRAFT_UNITS, MAX_COUNT, SpecDecodeAcceptanceRecord

logger = logging.getLogger("speclens.bench.adapters")

Responses = list[dict[str, Any]]

_KEY = re.compile(r"0|[1-9][0-9]*")


class Malformed(Exception):
    """The payload is present but cannot become a record; the message says why."""


class MultipleSequences(Malformed):
    """The request produced several sequences; its acceptance is suppressed, not mixed."""


#: In a reason: the record was suppressed for n > 1, not found malformed.
SUPPRESSED = "acceptance is suppressed"


# --- walking the responses ------------------------------------------------------------------------


def objects(responses: object) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``responses`` (anything else a client appended is skipped)."""
    if isinstance(responses, list):
        for item in responses:
            if isinstance(item, dict):
                yield item


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer: ``bool`` is an ``int`` subclass in Python but not a number on the wire."""
    return isinstance(value, int) and not isinstance(value, bool)


def choices(response: Mapping[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, choice)`` for each choice object; a choice without an integer index takes its
    position, which is what a single-sequence stream without indices means."""
    raw = response.get("choices")
    if isinstance(raw, list):
        for position, choice in enumerate(raw):
            if isinstance(choice, dict):
                index = choice.get("index")
                yield (index if is_int(index) else position), choice


def sequence_count(responses: object) -> int:
    """How many sequences the request produced: distinct choice indices across all objects, the
    most choices any one body carried, or distinct root ``index`` values (SGLang's native
    streaming labels each sequence's chunk at the root)."""
    indices: set[object] = set()
    root_indices: set[object] = set()
    most = 0
    for response in objects(responses):
        raw = response.get("choices")
        if isinstance(raw, list):
            most = max(most, len(raw))
            for position, choice in enumerate(raw):
                if isinstance(choice, dict):
                    index = choice.get("index")
                    indices.add(index if is_int(index) else position)
        root = response.get("index")
        if is_int(root):
            root_indices.add(root)
    return max(len(indices), len(root_indices), most)


def last_carrier(responses: object, pick: Callable[[dict[str, Any]], Any]) -> tuple[bool, Any]:
    """``(found, value)`` for the last object of ``responses`` whose ``pick`` is not None.

    The one "last carrier" lookup: a stream re-sends its stats cumulatively (or puts them on the
    finishing chunk), so the last carrier is the request's. Walks from the end, where the stats
    usually sit; ``pick`` says where in one object the value lives and which one wins there.
    """
    if not isinstance(responses, list):
        return False, None
    for response in reversed(responses):
        if isinstance(response, dict):
            value = pick(response)
            if value is not None:
                return True, value
    return False, None


def choice_value(key: str, index: int | None = None) -> Callable[[dict[str, Any]], Any]:
    """A ``pick`` for ``last_carrier``: the last choice's non-null ``key`` (of choice ``index``
    only, when given)."""

    def pick(response: dict[str, Any]) -> Any:
        for i, choice in reversed(list(choices(response))):
            if (index is None or i == index) and choice.get(key) is not None:
                return choice[key]
        return None

    return pick


def last_choice_value(responses: object, key: str) -> tuple[bool, Any]:
    """``(found, value)`` for the last choice carrying a non-null ``key`` (streaming engines put
    the final stats on the finishing chunk's choice; a cumulative re-send is superseded)."""
    return last_carrier(responses, choice_value(key))


def present_keys(responses: object) -> tuple[set[str], set[str]]:
    """The keys at the root of any object, and in any of its choices (null values included, so
    the sets only ever hold too much): one walk that lets detection skip every built-in shape
    whose markers are absent."""
    roots: set[str] = set()
    in_choices: set[str] = set()
    for response in objects(responses):
        roots.update(response)
        raw = response.get("choices")
        if isinstance(raw, list):
            for choice in raw:
                if isinstance(choice, dict):
                    in_choices.update(choice)
    return roots, in_choices


def completion_tokens(responses: object) -> int | None:
    """``usage.completion_tokens`` of the last object carrying usage; ``None`` when none did.

    Only the usage counts: engine-side fields such as SGLang's ``meta_info.completion_tokens``
    are ignored so every engine's record normalizes against the same number.
    """
    found, usage = last_carrier(responses, lambda response: response.get("usage"))
    if not found:
        return None
    if not isinstance(usage, dict):
        raise Malformed(f"usage is not an object: {usage!r:.80}")
    if usage.get("completion_tokens") is None:
        return None
    return as_count(usage["completion_tokens"], "usage.completion_tokens")


# --- reading fields -------------------------------------------------------------------------------


def as_object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed(f"{where} is not an object: {value!r:.80}")
    return value


def as_count(value: object, where: str) -> int:
    """A JSON integer in [0, 2**63 - 1]."""
    if not is_int(value):
        raise Malformed(f"{where} is not an integer: {value!r:.80}")
    if not 0 <= value <= MAX_COUNT:
        raise Malformed(f"{where} is out of range: {value}")
    return value


def as_number(value: object, where: str) -> float:
    """A finite JSON number (an integer is fine: some servers write 1 for 1.0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Malformed(f"{where} is not a number: {value!r:.80}")
    try:
        number = float(value)
    except OverflowError:
        raise Malformed(f"{where} is out of range") from None
    if not math.isfinite(number):
        raise Malformed(f"{where} is not finite: {value!r}")
    return number


def required(obj: Mapping[str, Any], key: str, where: str) -> Any:
    """A field that must be present and non-null."""
    if obj.get(key) is None:
        raise Malformed(f"{where}.{key} is missing")
    return obj[key]


# The readers below take a well-formed value at once and build a field's label for a message
# only when the value is wrong: detection runs once a request, with a dozen fields each.


def count(obj: Mapping[str, Any], key: str, where: str) -> int:
    """A required count."""
    value = obj.get(key)
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    return as_count(required(obj, key, where), f"{where}.{key}")


def number(obj: Mapping[str, Any], key: str, where: str) -> float:
    """A required finite number."""
    value = obj.get(key)
    if type(value) is float and math.isfinite(value):
        return value
    return as_number(required(obj, key, where), f"{where}.{key}")


def optional_count(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is None or (type(value) is int and 0 <= value <= MAX_COUNT):
        return value
    return as_count(value, f"{where}.{key}")


def optional_number(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    return None if obj.get(key) is None else as_number(obj[key], f"{where}.{key}")


def aliased_count(obj: Mapping[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    """One count that engines spell several ways; every spelling present must agree."""
    seen = {key: as_count(obj[key], f"{where}.{key}") for key in keys if obj.get(key) is not None}
    if len(set(seen.values())) > 1:
        raise Malformed(f"{where}: {seen} disagree")
    return next(iter(seen.values()), None)


def count_list(obj: Mapping[str, Any], key: str, where: str) -> list[int] | None:
    """An optional array of counts (the per-step arrays)."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise Malformed(f"{where}.{key} is not an array: {value!r:.80}")
    return [
        v if type(v) is int and 0 <= v <= MAX_COUNT else as_count(v, f"{where}.{key}[{i}]")
        for i, v in enumerate(value)
    ]


def dense_histogram(value: object, where: str) -> dict[int, int]:
    """A dense list, index j = steps that accepted exactly j drafts."""
    if not isinstance(value, list):
        raise Malformed(f"{where} is not an array: {value!r:.80}")
    return {j: as_count(n, f"{where}[{j}]") for j, n in enumerate(value)}


def keyed_histogram(value: object, where: str) -> dict[int, int]:
    """A map keyed by accepted-draft count: JSON string keys ("0", "12"; no signs, spaces or
    leading zeros) int-cast; integer keys are taken as they are (a pre-parsed payload)."""
    obj = as_object(value, where)
    out: dict[int, int] = {}
    for key, n in obj.items():
        if is_int(key):
            j = key
        elif isinstance(key, str) and _KEY.fullmatch(key):
            j = int(key)
        else:
            raise Malformed(f"{where} has a key that is not a count: {key!r:.40}")
        if j in out:
            raise Malformed(f"{where} holds key {j} twice")
        out[j] = n if type(n) is int and 0 <= n <= MAX_COUNT else as_count(n, f"{where}[{key!r}]")
    return out


def any_histogram(value: object, where: str) -> dict[int, int]:
    """Dense list or keyed map, whichever the engine sent."""
    return (
        dense_histogram(value, where) if isinstance(value, list) else keyed_histogram(value, where)
    )


# --- the base class -------------------------------------------------------------------------------


def summarize(exc: pydantic.ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in exc.errors()
    )


Choices = dict[int, SpecDecodeAcceptanceRecord]


class BuiltinAdapter:
    """Stateless; subclasses say where their shape lives (``_present``) and how it maps
    (``_build``). ``adapt`` never raises: a failure becomes ``None``, and ``diagnose`` says why.
    A record without a ``draft_unit`` gets its engine's (``DRAFT_UNITS``).

    The request's acceptance is suppressed for n > 1 (a root-level shape cannot say which
    sequence it counts); a per-sequence shape overrides ``_build_choices`` instead (TensorRT-LLM).
    """

    name: ClassVar[str]
    priority: ClassVar[int]
    engine: ClassVar[str]
    #: Keys (non-null) without one of which ``_present`` is false: at the root of an object, and
    #: in a choice. Detection skips the shape when none is present (``may_claim``).
    root_markers: ClassVar[frozenset[str]] = frozenset()
    choice_markers: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def may_claim(cls, keys: tuple[set[str], set[str]]) -> bool:
        """False only when ``keys`` (``present_keys``) hold none of this shape's markers."""
        roots, in_choices = keys
        if not (cls.root_markers or cls.choice_markers):
            return True
        return not (
            cls.root_markers.isdisjoint(roots) and cls.choice_markers.isdisjoint(in_choices)
        )

    @classmethod
    def can_adapt(cls, responses: Responses) -> bool:
        try:
            return cls._present(responses)
        except Exception:  # an adapter must never take detection down
            logger.debug("%s: can_adapt failed", cls.name, exc_info=True)
            return False

    @classmethod
    def adapt(cls, responses: Responses) -> SpecDecodeAcceptanceRecord | None:
        return cls.diagnose(responses)[0]

    @classmethod
    def diagnose(cls, responses: Responses) -> tuple[SpecDecodeAcceptanceRecord | None, str | None]:
        """``(record, None)``, or ``(None, why there is no record)``."""
        record, _, reason = cls.diagnose_choices(responses)
        return record, reason

    @classmethod
    def diagnose_choices(
        cls, responses: Responses
    ) -> tuple[SpecDecodeAcceptanceRecord | None, Choices | None, str | None]:
        """``diagnose`` plus, for n > 1 with per-sequence stats, each choice's record (the
        request's record is then their sum)."""
        try:
            if not cls._present(responses):
                return None, None, f"{cls.name}: no payload of this shape"
            n = sequence_count(responses)
            if n > 1:
                per_choice = cls._build_choices(responses)
                if per_choice is None:
                    raise MultipleSequences(f"n > 1 ({n} sequences): {SUPPRESSED}")
                per_choice = {i: _with_unit(r) for i, r in per_choice.items()}
                return _with_unit(pooled(cls.engine, per_choice, responses)), per_choice, None
            return _with_unit(cls._build(responses)), None, None
        except Malformed as exc:
            reason = str(exc)
        except pydantic.ValidationError as exc:
            reason = f"self-contradicting: {summarize(exc)}"
        except Exception as exc:  # anything else is a payload shape nobody anticipated
            logger.debug("%s: adapt failed", cls.name, exc_info=True)
            reason = f"unreadable payload ({type(exc).__name__}: {exc})"
        return None, None, f"{cls.name}: {reason}"

    @classmethod
    def absent_note(cls, responses: Responses) -> str | None:
        """Said when nothing was detected: a field of this engine that is not acceptance."""
        return None

    @classmethod
    def _build_choices(cls, responses: Responses) -> Choices | None:
        """Each choice's record for n > 1, or None where the shape is not per sequence."""
        return None

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        raise NotImplementedError

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        raise NotImplementedError


def _with_unit(record: SpecDecodeAcceptanceRecord) -> SpecDecodeAcceptanceRecord:
    if record.draft_unit is not None or record.engine not in DRAFT_UNITS:
        return record
    return record.model_copy(update={"draft_unit": DRAFT_UNITS[record.engine]})


def pooled(engine: str, per_choice: Choices, responses: Responses) -> SpecDecodeAcceptanceRecord:
    """One request's acceptance over its sequences: every count summed (histograms bucket by
    bucket), K shared. ``completion_tokens`` is the usage's, which covers every choice."""
    records = list(per_choice.values())
    ks = {r.num_spec_tokens for r in records}
    if len(ks) > 1:
        raise Malformed(f"the choices report different K: {sorted(ks, key=str)}")
    accepted = sum(r.num_accepted_draft_tokens for r in records)
    drafted = sum(r.num_draft_tokens for r in records)
    full = all(r.num_spec_steps is not None for r in records)
    steps = sum(r.num_spec_steps or 0 for r in records) if full else None
    hist: dict[int, int] | None = None
    if full and all(r.acceptance_histogram is not None for r in records):
        hist = {}
        for r in records:
            for j, n in (r.acceptance_histogram or {}).items():
                hist[j] = hist.get(j, 0) + n
    decode = [r.num_decode_steps for r in records]
    if max(accepted, drafted, steps or 0) > MAX_COUNT:
        raise Malformed("the choices' counts sum beyond 2**63 - 1")
    return SpecDecodeAcceptanceRecord(
        engine=engine,
        mean_acceptance_length=None if steps is None else acceptance_length(accepted, steps),
        draft_acceptance_rate=accepted / drafted if drafted else 0.0,
        acceptance_histogram=hist,
        num_accepted_draft_tokens=accepted,
        num_draft_tokens=drafted,
        num_spec_steps=steps,
        num_spec_tokens=ks.pop(),
        num_decode_steps=sum(d for d in decode if d is not None)
        if full and None not in decode
        else None,
        completion_tokens=completion_tokens(responses),
    )
