"""What a step costs: the one step-cost type and formula, shared by the engine's ``sim``
executor (``speclens.engine.StepCost`` is this class), the scenario file's ``step_cost`` and the
fast path, which prices whole numpy arrays of steps with the same methods.

Torch-free (numpy loads only to fit), so the scenario schema and the fast path run without the
engine extra; for the same reason the engine's KV block size is defined here. A layer of its own,
under both the engine and the simulator, over ``acceptance`` only: the engine never imports the
simulator.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator, BaseModel, GetCoreSchemaHandler, create_model
from pydantic_core import PydanticCustomError, core_schema

#: Tokens per block of the engine's paged KV cache (``EngineConfig.block_size``'s default).
BLOCK_SIZE = 16

#: A count, or a numpy array of counts (one per step): every price below is elementwise.
Count = Any


def seconds_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a price in seconds (None when it can): a bad price kills the
    engine thread mid-run, and an infinite one fills the simulator's clock with inf and NaN."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        return f"expected a finite number >= 0 (seconds), got {value!r}"
    return None


def _seconds(value: float) -> float:
    problem = seconds_problem(value)
    if problem is not None:
        raise PydanticCustomError("speclens", "{message}", {"message": problem})
    return value


Seconds = Annotated[float, AfterValidator(_seconds)]


class Pricing(Protocol):
    """What prices steps: ``StepCost`` (affine, fitted or stated) or ``roofline.Roofline``
    (from a model and a chip). Counts may be numpy arrays, one per step."""

    def problems(self) -> list[str]: ...
    def describe(self) -> dict[str, Any]: ...
    def prefill(self, query_tokens: Count, requests: Count, context_tokens: Count) -> Any: ...
    def verify(self, query_tokens: Count, requests: Count, context_tokens: Count) -> Any: ...
    def draft(self, requests: Count) -> Any: ...
    def decode(
        self, query_tokens: Count, requests: Count, context_tokens: Count, drafting: Count, k: int
    ) -> Any: ...


@dataclass
class StepCost:
    """A step's price in seconds (fit from a ``torch`` run).

    verify/prefill: ``base + per_token * query_tokens + per_seq * requests
    + per_context_token * context_tokens``; drafting: ``draft_base + draft_per_token *
    requests`` per drafter forward, K forwards per step. ``draft_per_token`` is per request
    drafting (each drafter forward after the first queries one token per request): ``fit``
    regresses the drafter's seconds per forward on the request count, and the sim drafter
    prices it so.

    Constructing one checks nothing (``problems`` does, ``EngineConfig.validate`` calls it); as
    a field of a pydantic model (a scenario's ``step_cost``) it is validated like the model.
    """

    base: float = 2e-3
    per_token: float = 2e-5
    per_seq: float = 1e-5
    per_context_token: float = 1e-8
    draft_base: float = 5e-4
    draft_per_token: float = 5e-6
    #: Prefill steps, when priced apart from verification (None: priced as a verify step).
    prefill_base: float | None = None
    prefill_per_token: float | None = None

    def problems(self) -> list[str]:
        """``<field>: <what is wrong>`` for each field that is not a finite number >= 0 (the
        prefill pair may also be null)."""
        found = []
        for name, value in vars(self).items():
            if value is None and name.startswith("prefill_"):
                continue
            problem = seconds_problem(value)
            if problem is not None:
                found.append(f"{name}: {problem}")
        return found

    def describe(self) -> dict[str, Any]:
        """How steps are priced, for a run's output."""
        return {"kind": "step_cost", **asdict(self)}

    def prefill(self, query_tokens: Count, requests: Count, context_tokens: Count) -> Any:
        if self.prefill_base is None or self.prefill_per_token is None:
            return self.verify(query_tokens, requests, context_tokens)
        return self.prefill_base + self.prefill_per_token * query_tokens

    def verify(self, query_tokens: Count, requests: Count, context_tokens: Count) -> Any:
        return (
            self.base
            + self.per_token * query_tokens
            + self.per_seq * requests
            + self.per_context_token * context_tokens
        )

    def draft(self, requests: Count) -> Any:
        """One drafter forward over ``requests`` drafting requests."""
        return self.draft_base + self.draft_per_token * requests

    def decode(
        self, query_tokens: Count, requests: Count, context_tokens: Count, drafting: Count, k: int
    ) -> Any:
        """A decode step: the verify forward, and K drafter forwards over its ``drafting``
        requests, none when no request drafts."""
        return self.verify(query_tokens, requests, context_tokens) + k * (
            drafting > 0
        ) * self.draft(drafting)

    @classmethod
    def fit(cls, steps: Sequence[StepLike], num_spec_tokens: int) -> StepCost:
        """Least-squares fit to the steps of a ``torch`` run (``Engine.steps``).

        The target's share of every step (its seconds less the drafter's) prices the verify
        terms; the drafter's share of decode steps, over K forwards, prices the draft terms.
        Coefficients come out non-negative (a term the data cannot see is dropped to 0).
        """
        import numpy as np

        rows = [s for s in steps if s.num_requests > 0]
        if len(rows) < 4:
            raise ValueError(f"need at least 4 steps to fit a step cost, got {len(rows)}")
        prefills = [s for s in rows if s.kind == "prefill"]
        decodes = [s for s in rows if s.kind != "prefill"]
        prefill: list[float | None] = [None, None]
        if len(decodes) >= 4 and len(prefills) >= 3:
            # Enough of both: a prefill (one long query) and a verify step cost differently.
            xp = np.array([[1.0, s.query_tokens] for s in prefills], dtype=float)
            yp = np.array([s.seconds for s in prefills], dtype=float)
            prefill = list(_nonnegative_lstsq(xp, yp))
            rows = decodes
        x = np.array(
            [[1.0, s.query_tokens, s.num_requests, s.context_tokens] for s in rows], dtype=float
        )
        y = np.array([s.seconds - s.draft_seconds for s in rows], dtype=float)
        verify = _nonnegative_lstsq(x, y)
        drafting = [s for s in rows if s.kind == "decode" and s.draft_seconds > 0]
        draft = [cls.draft_base, cls.draft_per_token]
        if num_spec_tokens and len(drafting) >= 2:
            xd = np.array([[1.0, s.num_requests] for s in drafting], dtype=float)
            yd = np.array([s.draft_seconds / num_spec_tokens for s in drafting], dtype=float)
            draft = list(_nonnegative_lstsq(xd, yd))
        return cls(
            base=verify[0],
            per_token=verify[1],
            per_seq=verify[2],
            per_context_token=verify[3],
            draft_base=float(draft[0]),
            draft_per_token=float(draft[1]),
            prefill_base=prefill[0],
            prefill_per_token=prefill[1],
        )

    # ------------------------------------------------------------ as a field of a file
    @classmethod
    def model_validate(cls, data: Any) -> StepCost:
        """A mapping (a ``step_cost_file``) validated as a scenario's ``step_cost`` is: every
        problem at once, as a pydantic ``ValidationError``."""
        return cls(**dict(_schema().model_validate(data)))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            lambda fields: cls(**dict(fields)),
            handler(_schema()),
            serialization=core_schema.plain_serializer_function_ser_schema(asdict),
        )


@functools.cache
def _schema() -> type[BaseModel]:
    """The fields of ``StepCost`` as a strict, closed model (built once, from the dataclass:
    one list of fields and defaults)."""
    from speclens.acceptance.schema import _Model

    spec: dict[str, Any] = {
        f.name: (Seconds | None if f.name.startswith("prefill_") else Seconds, f.default)
        for f in fields(StepCost)
    }
    return create_model("StepCost", __base__=_Model, **spec)


class StepLike(Protocol):
    """What ``StepCost.fit`` reads of a step record."""

    kind: str
    num_requests: int
    query_tokens: int
    context_tokens: int
    seconds: float
    draft_seconds: float


def _nonnegative_lstsq(x: Any, y: Any) -> list[float]:
    """Least squares with non-negative coefficients: refit without any term that came out
    negative (small problems; at most one pass per term)."""
    import numpy as np

    active = list(range(x.shape[1]))
    # A term whose regressor barely varies cannot be told from the intercept: leave it at 0.
    spread = x.std(axis=0) / (abs(x).mean(axis=0) + 1e-12)
    active = [a for a in active if a == 0 or spread[a] > 0.05]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [a for a, c in zip(active, coef, strict=True) if c < 0]
        if not negative:
            out = [0.0] * x.shape[1]
            for a, c in zip(active, coef, strict=True):
                out[a] = float(c)
            return out
        active.remove(min(negative, key=lambda a: coef[active.index(a)]))
