"""Engine adapters: the only code that knows an engine's on-the-wire spec-decode shape.

An adapter turns the raw JSON objects one request produced (the single body, or every parsed SSE
data chunk in order) into a ``SpecDecodeAcceptanceRecord``. Adapters are stateless classes with
two classmethods, ``can_adapt`` (does this payload carry my shape?) and ``adapt`` (the record, or
None when the payload is present but unusable), plus ``name`` and ``priority`` (lower runs first).

``detect`` walks every adapter in priority order. Several shapes can sit in one response (our
server emits vLLM's per-choice object and its root metrics together): when every claimant reads
the same numbers the highest-priority record is used; when they disagree nothing is picked,
the conflict is reported, not guessed. Third-party adapters register in the entry-point group
``speclens.spec_decode_adapters``; a broken one is skipped with a warning.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

from speclens.bench.adapters._common import (
    SUPPRESSED,
    BuiltinAdapter,
    present_keys,
    sequence_count,
)
from speclens.bench.adapters.llamacpp import LlamaCppTimingsAdapter
from speclens.bench.adapters.sglang import SGLangSpecDecodeAdapter
from speclens.bench.adapters.stats_object import VLLMSpecDecodeAdapter
from speclens.bench.adapters.trtllm import TRTLLMSpecDecodeAdapter
from speclens.bench.adapters.vllm_metrics import VLLMMetricsAdapter
from speclens.runs.record import SpecDecodeAcceptanceRecord

__all__ = [
    "BUILTIN_ADAPTERS",
    "ENTRY_POINT_GROUP",
    "Detection",
    "DetectionStatus",
    "LlamaCppTimingsAdapter",
    "SGLangSpecDecodeAdapter",
    "SpecDecodeAdapter",
    "TRTLLMSpecDecodeAdapter",
    "VLLMMetricsAdapter",
    "VLLMSpecDecodeAdapter",
    "available_adapters",
    "detect",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "speclens.spec_decode_adapters"

DetectionStatus = Literal["ok", "absent", "malformed", "multiple_sequences", "conflict"]


@runtime_checkable
class SpecDecodeAdapter(Protocol):
    """What an adapter is. Implement it with classmethods on a class and register the class."""

    name: str
    priority: int

    @classmethod
    def can_adapt(cls, responses: list[dict[str, Any]]) -> bool:
        """True when ``responses`` carry this adapter's shape (a null field counts as absent)."""
        ...

    @classmethod
    def adapt(cls, responses: list[dict[str, Any]]) -> SpecDecodeAcceptanceRecord | None:
        """The record, or None for a malformed, contradicting or n > 1 payload; never raises."""
        ...


BUILTIN_ADAPTERS: tuple[SpecDecodeAdapter, ...] = (
    VLLMMetricsAdapter,
    VLLMSpecDecodeAdapter,
    TRTLLMSpecDecodeAdapter,
    SGLangSpecDecodeAdapter,
    LlamaCppTimingsAdapter,
)

_discovered: list[SpecDecodeAdapter] | None = None


def available_adapters(*, refresh: bool = False) -> list[SpecDecodeAdapter]:
    """The built-ins plus the entry-point plugins, sorted by priority then name.

    Discovery runs once per process (``detect`` runs per request); ``refresh=True`` rescans,
    e.g. after installing a plugin in a running process.
    """
    global _discovered
    if _discovered is None or refresh:
        _discovered = _discover()
    return list(_discovered)


def _discover() -> list[SpecDecodeAdapter]:
    found: list[SpecDecodeAdapter] = list(BUILTIN_ADAPTERS)
    names = {adapter.name for adapter in found}
    try:
        plugins = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:
        logger.warning("cannot list %s plugins (%s); using the built-ins", ENTRY_POINT_GROUP, exc)
        plugins = []
    for plugin in plugins:
        label = f"{getattr(plugin, 'name', '?')} = {getattr(plugin, 'value', '?')}"
        try:
            obj = plugin.load()
        except (Exception, SystemExit) as exc:
            logger.warning(
                "skipping spec-decode adapter plugin %s: it failed to load (%s: %s)",
                label,
                type(exc).__name__,
                exc,
            )
            continue
        problem = _plugin_problem(obj)
        if problem is None and obj.name in names:
            problem = f"its name {obj.name!r} is already taken"
        if problem is not None:
            logger.warning("skipping spec-decode adapter plugin %s: %s", label, problem)
            continue
        names.add(obj.name)
        found.append(obj)
    return sorted(found, key=_order)


def _plugin_problem(obj: object) -> str | None:
    try:
        if not isinstance(obj, SpecDecodeAdapter):
            return "it lacks name, priority, can_adapt or adapt"
        if not isinstance(obj.name, str) or not obj.name:
            return f"name {obj.name!r} is not a non-empty string"
        if isinstance(obj.priority, bool) or not isinstance(obj.priority, int):
            return f"priority {obj.priority!r} is not an integer"
        if not (callable(obj.can_adapt) and callable(obj.adapt)):
            return "can_adapt and adapt must be callable"
    except Exception as exc:
        return f"it cannot be inspected ({type(exc).__name__}: {exc})"
    return None


def _name(adapter: object) -> str:
    name = getattr(adapter, "name", None)
    return name if isinstance(name, str) and name else repr(adapter)


def _order(adapter: object) -> tuple[int, str]:
    """Priority, then name; an adapter without a usable priority goes last instead of failing."""
    priority = getattr(adapter, "priority", None)
    if isinstance(priority, bool) or not isinstance(priority, int):
        priority = sys.maxsize
    return priority, _name(adapter)


@dataclass(frozen=True)
class Detection:
    """What auto-detection found for one request, and why when there is no record.

    - ``ok``: ``record`` is set; ``adapter`` is the highest-priority claimant. For n > 1 with a
      per-sequence shape (TensorRT-LLM), ``choices`` holds each choice's record and ``record``
      their sum.
    - ``absent``: no adapter recognised a payload (spec decode off): not an error.
    - ``malformed``: claimed, but no record could be built; ``message`` says why.
    - ``multiple_sequences``: claimed, but the request had n > 1, so acceptance is suppressed.
    - ``conflict``: several claimants read different numbers; nothing is picked.
    """

    record: SpecDecodeAcceptanceRecord | None
    adapter: str | None
    status: DetectionStatus
    message: str | None = None
    claimed_by: list[str] = field(default_factory=list)
    #: n > 1 with per-choice stats (TensorRT-LLM): each choice's record, keyed by choice index.
    choices: dict[int, SpecDecodeAcceptanceRecord] | None = None


@dataclass(frozen=True)
class _Outcome:
    name: str
    record: SpecDecodeAcceptanceRecord | None
    reason: str | None
    choices: dict[int, SpecDecodeAcceptanceRecord] | None = None


def detect(
    responses: list[dict[str, Any]], adapters: Iterable[SpecDecodeAdapter] | None = None
) -> Detection:
    """Find and read the request's spec-decode payload; never raises, whatever the payload.

    An adapter that raises (in ``can_adapt`` or ``adapt``) counts as a claimant that found no
    record, so a broken plugin shows up as ``malformed`` or ``conflict`` instead of vanishing.
    """
    try:
        if adapters is None:  # discovery sorted them once (detect runs per request)
            if _discovered is None:
                available_adapters()
            pool = _discovered or []
        else:
            pool = sorted(adapters, key=_order)
        return _detect(responses, pool)
    except Exception as exc:  # a last resort: detection must not take a benchmark run down
        logger.debug("spec-decode detection failed", exc_info=True)
        return Detection(None, None, "malformed", f"detection failed: {type(exc).__name__}: {exc}")


def _detect(responses: list[dict[str, Any]], pool: list[SpecDecodeAdapter]) -> Detection:
    outcomes: list[_Outcome] = []
    keys = present_keys(responses)
    for adapter in pool:
        if _builtin(adapter) and not adapter.may_claim(keys):
            continue  # none of its markers: its ``can_adapt`` would say no
        name = _name(adapter)
        try:
            claimed = bool(adapter.can_adapt(responses))
        except Exception as exc:
            outcomes.append(_Outcome(name, None, f"{name}: can_adapt raised {_exc(exc)}"))
            continue
        if claimed:
            outcomes.append(_adapt(adapter, name, responses))
    claimed_by = [o.name for o in outcomes]
    if not outcomes:
        message = "no speculative-decoding payload recognised"
        n = sequence_count(responses)
        if n > 1:  # engines that suppress n > 1 server-side (ours, vLLM's root metrics) send none
            message += f" (the request had {n} sequences; engines omit the stats for n > 1)"
        notes = [note for adapter in pool if (note := _absent_note(adapter, responses))]
        return Detection(None, None, "absent", "; ".join([message, *notes]))
    good = [o for o in outcomes if o.record is not None]
    bad = [o for o in outcomes if o.record is None]
    if not good:
        n = sequence_count(responses)
        # n > 1 is "multiple_sequences" unless a per-sequence shape was read and found malformed
        suppressed = n > 1 and all(o.reason is None or SUPPRESSED in o.reason or
                                   "adapt returned None" in o.reason for o in bad)  # fmt: skip
        status: DetectionStatus = "multiple_sequences" if suppressed else "malformed"
        reasons = "; ".join(o.reason or f"{o.name}: no record" for o in bad)
        return Detection(None, bad[0].name, status, reasons, claimed_by)
    if bad:
        why = "; ".join(o.reason or f"{o.name}: no record" for o in bad)
        message = (
            f"{_names(good)} read a record but {_names(bad)} did not ({why}): reported, not guessed"
        )
        return Detection(None, None, "conflict", message, claimed_by)
    records = [(o.name, o.record) for o in good if o.record is not None]
    first_name, first = records[0]
    choices = good[0].choices
    clashes = [
        f"{first_name} and {name} disagree on {', '.join(first.differences(record))}"
        for name, record in records[1:]
        if not first.same_measurement(record)
    ]
    if clashes:
        message = f"{'; '.join(clashes)}: reported, not guessed"
        return Detection(None, None, "conflict", message, claimed_by)
    return Detection(first, first_name, "ok", None, claimed_by, choices)


def _absent_note(adapter: SpecDecodeAdapter, responses: list[dict[str, Any]]) -> str | None:
    if not _builtin(adapter):
        return None
    try:
        return adapter.absent_note(responses)
    except Exception:
        logger.debug("%s: absent_note failed", adapter.name, exc_info=True)
        return None


def _adapt(adapter: SpecDecodeAdapter, name: str, responses: list[dict[str, Any]]) -> _Outcome:
    """Run one claimant; built-ins also say why they found no record (``diagnose``) and give
    each choice's record for n > 1 where their shape is per sequence."""
    choices = None
    try:
        if _builtin(adapter):
            record, choices, reason = adapter.diagnose_choices(responses)
        else:
            record, reason = adapter.adapt(responses), None
    except Exception as exc:
        return _Outcome(name, None, f"{name}: adapt raised {_exc(exc)}")
    if record is not None and not isinstance(record, SpecDecodeAcceptanceRecord):
        return _Outcome(name, None, f"{name}: adapt returned a {type(record).__name__}")
    if record is None and reason is None:
        reason = f"{name}: payload present but unusable (adapt returned None)"
    return _Outcome(name, record, reason, choices)


def _builtin(adapter: SpecDecodeAdapter) -> TypeGuard[type[BuiltinAdapter]]:
    return isinstance(adapter, type) and issubclass(adapter, BuiltinAdapter)


def _names(outcomes: list[_Outcome]) -> str:
    return ", ".join(o.name for o in outcomes)


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
