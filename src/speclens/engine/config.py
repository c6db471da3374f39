"""Engine configuration and its startup validation.

``SpeculativeConfig`` resolves forced acceptance exactly once: whichever knob was set (a length,
a rate, or explicit per-position rates) becomes ``per_position_rates``, and nothing downstream
reads the spellings again. A spread between requests (``acceptance_spread``) rides with it,
checked against its K and AL here. Every refusal is a ``ConfigError`` with its own message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from speclens.acceptance import (
    MAX_NUM_SPEC_TOKENS,
    AcceptanceSpread,
    ValidationError,
    check_rates,
    is_minimum_variance,
    length_from_rate,
    length_from_rates,
    minimum_variance_rates,
)
from speclens.acceptance.spread import fitted, quantile_problems
from speclens.cost import BLOCK_SIZE
from speclens.cost import Pricing as Pricing
from speclens.cost import StepCost as StepCost  # the sim executor's prices, torch-free

#: Drafters this engine can run with real forward passes.
TORCH_METHODS = ("draft_model", "ngram")
ExecutorName = Literal["torch", "sim"]


#: The most tensor-parallel ranks a run may ask for (a sanity bound far above TP 8).
MAX_TENSOR_PARALLEL = 64


class ConfigError(ValueError):
    """A configuration refused at startup."""


class ModelLoadError(ConfigError):
    """A model (target or drafter) that cannot be loaded: missing, unreadable or unsupported.

    ``spec`` is what the user named (``--model`` or ``--draft-model``), so a caller can say which
    flag to fix; the message names the file and what is wrong with it.
    """

    def __init__(self, spec: str, message: str) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the cause printed
        self.spec = spec


#: Seeds every generator takes (torch's ``manual_seed`` keeps 64 bits; drafters use seed + 1).
MAX_SEED = 2**63 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_seed(seed: Any, name: str = "--seed") -> None:
    """Refuse a seed the generators cannot all take (negative, too large, not an integer)."""
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{name} {seed!r}: expected an integer in [0, 2**63 - 1]")


def layer_subset(draft_model: str | None) -> int | None:
    """N of a ``layers:N`` drafter (the target's first N layers), None for any other drafter."""
    if draft_model is None or not draft_model.startswith("layers:"):
        return None
    text = draft_model.split(":", 1)[1]
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"--draft-model {draft_model}: expected layers:N with N a positive integer "
            "(the target's first N layers)"
        )
    return int(text)


@dataclass
class SpeculativeConfig:
    """Speculative decoding: the drafter, K, and (optionally) forced acceptance.

    ``acceptance_length`` and ``acceptance_rate`` are the two spellings of one forced target
    (length = 1 + K * rate); ``acceptance_rates`` states the per-position rates directly.
    ``confidence_schedule`` lets the drafter stop before K when its confidence falls below
    ``confidence_threshold``. ``acceptance_spread`` (forced acceptance only) states how the
    per-request AL spreads around the forced one: each request then draws its own.
    """

    method: str | None = None
    num_speculative_tokens: int = 0
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    acceptance_rates: list[float] | None = None
    confidence_schedule: bool = False
    confidence_threshold: float = 0.5
    draft_model: str | None = None
    #: n-gram drafter: the longest and shortest suffix it looks up in the context (vLLM's
    #: ``prompt_lookup_max``/``min``; its default when neither is given is 5 and 5).
    ngram_max: int = 5
    ngram_min: int = 5
    #: Seed of the forced-acceptance stream (every rank must use the same one).
    seed: int = 0
    #: Per-request AL quantiles around the forced AL (``--spec-decode-acceptance-spread``, or an
    #: acceptance profile's); None: every request gets the forced schedule itself.
    acceptance_spread: AcceptanceSpread | None = None
    #: The share of decode steps that draft, which a spread's request measure weighs a request's
    #: AL by (``acceptance.spread``): 1 for the server's forced drafters, which always draft;
    #: the simulator's stated coverage on its exact loop.
    spread_coverage: float = 1.0
    #: Forced acceptance only: each request-step drafts with this probability, a step that does
    #: not being a plain decode step (``serve --spec-decode-draft-coverage``), so tokens per decode
    #: step are 1 + coverage x (AL - 1) as under natural n-gram drafting. 1: every step drafts.
    draft_coverage: float = 1.0
    per_position_rates: list[float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._check_types()
        self.per_position_rates = self._resolve()
        self._check_spread()
        self._check_coverage()

    @property
    def enabled(self) -> bool:
        """Speculative decoding is on (a method and K >= 1)."""
        return bool(self.method) and self.num_speculative_tokens > 0

    @property
    def forced(self) -> bool:
        """Acceptance is forced (synthetic), not decided by the target."""
        return self.per_position_rates is not None

    @property
    def forced_acceptance_length(self) -> float | None:
        rates = self.per_position_rates
        return None if rates is None else length_from_rates(rates)

    @property
    def rates_derived(self) -> bool:
        """The forced rates are the minimum-variance schedule of their AL (derived from a
        length or rate, or stated and equal to it), so each request's own schedule under a
        spread is the minimum-variance one at its AL; other stated rates keep their shape."""
        rates = self.per_position_rates
        return rates is None or self.acceptance_rates is None or is_minimum_variance(rates)

    def _check_coverage(self) -> None:
        """Coverage below 1 is a forcing: it needs forced acceptance, and lies in (0, 1]."""
        coverage = self.draft_coverage
        if (
            isinstance(coverage, bool)
            or not isinstance(coverage, int | float)
            or not (0 < coverage <= 1)
        ):
            raise ConfigError(
                f"draft_coverage (--spec-decode-draft-coverage): expected a number in (0, 1], "
                f"got {coverage!r}"
            )
        if coverage < 1 and not self.forced:
            raise ConfigError(
                "draft_coverage (--spec-decode-draft-coverage): expected forced acceptance "
                "(--spec-decode-acceptance-length or -rate): natural drafting covers what it "
                "covers"
            )

    def _check_spread(self) -> None:
        """A spread needs forced acceptance, K equal to its own, and an implied mean within its
        tolerance of the forced AL."""
        spread = self.acceptance_spread
        if spread is None:
            return
        coverage = self.spread_coverage
        if (
            isinstance(coverage, bool)
            or not isinstance(coverage, int | float)
            or not (0 < coverage <= 1)
        ):
            raise ConfigError(f"spread_coverage: expected a number in (0, 1], got {coverage!r}")
        length = self.forced_acceptance_length
        if length is None:
            raise ConfigError(
                "acceptance_spread (--spec-decode-acceptance-spread): expected forced acceptance "
                "(--spec-decode-acceptance-length, a rate, or an acceptance profile): a spread "
                "spreads a forced AL between requests"
            )
        k = self.num_speculative_tokens
        if spread.num_spec_tokens != k:
            raise ConfigError(
                f"acceptance_spread.num_spec_tokens: is {spread.num_spec_tokens}, but "
                f"num_speculative_tokens is {k}: a spread is refused at another K, never rescaled"
            )
        for problem in quantile_problems(spread.values, k, length, spread.tolerance):
            raise ConfigError(f"acceptance_spread.quantiles: {problem}")

    def _check_types(self) -> None:
        """Refuse wrong types up front: a string where a number belongs would otherwise fail
        inside the engine's step loop, long after startup said yes."""
        k = self.num_speculative_tokens
        if not _is_int(k) or k < 0:
            raise ConfigError(f"num_speculative_tokens must be an integer >= 0, got {k!r}")
        if k > MAX_NUM_SPEC_TOKENS:  # K sizes per-step buffers: a huge one overflows or OOMs
            raise ConfigError(
                f"num_speculative_tokens must be at most {MAX_NUM_SPEC_TOKENS}, got {k}"
            )
        if self.method is not None and not isinstance(self.method, str):
            raise ConfigError(f"speculative method must be a name (a string), got {self.method!r}")
        if self.draft_model is not None and not isinstance(self.draft_model, str):
            raise ConfigError(f"--draft-model must be a string, got {self.draft_model!r}")
        layer_subset(self.draft_model)
        for name in ("acceptance_length", "acceptance_rate"):
            value = getattr(self, name)
            if value is not None and not _is_number(value):
                flag = "--spec-decode-" + name.replace("_", "-")
                raise ConfigError(f"{flag}: expected a number, got {value!r}")
        rates = self.acceptance_rates
        if rates is not None and (
            not isinstance(rates, list) or not all(_is_number(r) for r in rates)
        ):
            raise ConfigError(
                f"synthetic_acceptance_rates: expected a list of numbers, got {rates!r}"
            )
        if not isinstance(self.confidence_schedule, bool):
            raise ConfigError(
                f"confidence_schedule must be true or false, got {self.confidence_schedule!r}"
            )
        if not _is_number(self.confidence_threshold) or not 0 <= self.confidence_threshold <= 1:
            raise ConfigError(
                f"confidence_threshold must be a number in [0, 1], got {self.confidence_threshold!r}"
            )
        for name, value in (
            ("prompt_lookup_max", self.ngram_max),
            ("prompt_lookup_min", self.ngram_min),
        ):
            if not _is_int(value) or value < 1:
                raise ConfigError(
                    f"{name} (n-gram length): expected an integer >= 1, got {value!r}"
                )
        if self.ngram_min > self.ngram_max:
            raise ConfigError(
                f"prompt_lookup_min {self.ngram_min} is above prompt_lookup_max {self.ngram_max}"
            )
        check_seed(self.seed)
        spread = self.acceptance_spread
        if spread is not None and not isinstance(spread, AcceptanceSpread):
            raise ConfigError(
                "acceptance_spread: expected an AcceptanceSpread (per-request AL quantiles), got "
                f"{type(spread).__name__}"
            )

    def _resolve(self) -> list[float] | None:
        k = self.num_speculative_tokens
        if self.method and k == 0:
            raise ConfigError(
                f"speculative method {self.method!r} needs num_speculative_tokens >= 1"
            )
        if self.acceptance_length is not None and self.acceptance_rate is not None:
            raise ConfigError(
                "--spec-decode-acceptance-length and --spec-decode-acceptance-rate describe the "
                "same target; set only one (prefer the length form: published figures are lengths)"
            )
        forced = (
            self.acceptance_length is not None
            or self.acceptance_rate is not None
            or self.acceptance_rates is not None
        )
        if forced and not self.enabled:
            raise ConfigError(
                "forced acceptance needs a speculative method (--method) and a non-zero "
                "--num-speculative-tokens: without draft positions there is no schedule to "
                "resolve, and the flag is refused rather than silently ignored"
            )
        if k and not self.method:
            raise ConfigError(
                f"--num-speculative-tokens {k} needs a speculative method (--method): without one "
                "speculation is off, and K is refused rather than silently ignored"
            )
        if not forced:
            return None
        length = self.acceptance_length
        if length is not None and not (math.isfinite(length) and 1.0 <= length <= k + 1):
            raise ConfigError(
                f"--spec-decode-acceptance-length {length:g} is outside [1, num_speculative_tokens"
                f" + 1] = [1, {k + 1}]: it counts the target's own token, so it is at least 1, "
                f"and at most {k + 1} when all {k} drafts are accepted"
            )
        rate = self.acceptance_rate
        if rate is not None:
            if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
                raise ConfigError(f"--spec-decode-acceptance-rate {rate:g} is outside [0, 1]")
            length = length_from_rate(rate, k)
        if self.confidence_schedule:
            raise ConfigError(self._confidence_refusal(length))
        if self.acceptance_rates is not None:
            return self._explicit_rates(length)
        assert length is not None
        return minimum_variance_rates(length, k)

    def _explicit_rates(self, length: float | None) -> list[float]:
        k = self.num_speculative_tokens
        try:
            rates = check_rates(self.acceptance_rates or [], k)
        except ValidationError as exc:
            raise ConfigError(f"synthetic acceptance rates are invalid: {exc}") from None
        if length is not None and abs(length_from_rates(rates) - length) > 0.01:
            raise ConfigError(
                f"the per-position rates imply acceptance length {length_from_rates(rates):g}, "
                f"not the requested {length:g}"
            )
        return rates

    def _confidence_refusal(self, length: float | None) -> str:
        k = self.num_speculative_tokens
        rates = (
            check_rates(self.acceptance_rates, k)
            if self.acceptance_rates is not None
            else minimum_variance_rates(length or 1.0, k)
        )
        target = length_from_rates(rates)
        need = sum(1 for r in rates if r > 0)
        shortfall = ", ".join(
            f"at most {1 + sum(rates[:ell]):.2f} at ell_r = {ell}" for ell in range(need - 1, 0, -1)
        )
        detail = f" ({shortfall})" if shortfall else ""
        return (
            "forced acceptance cannot run with the confidence schedule: it sizes each request's "
            "verify length ell_r at runtime, and when ell_r comes back shorter than the schedule "
            f"needs, the run lands under the length it was asked to reproduce. At length "
            f"{target:g} over {k} positions the result is exact only while ell_r >= {need}"
            f"{detail}. Because ell_r is a runtime decision no upfront check can catch the "
            "shortfall, so the combination is refused: drop confidence_schedule for "
            "forced-acceptance runs"
        )

    def log_line(self) -> str | None:
        """The startup line that confirms forced acceptance (None when it is off)."""
        rates = self.per_position_rates
        if rates is None:
            return None
        spreads = ""
        spread = self.acceptance_spread
        if spread is not None:
            knots = fitted(spread.values, length_from_rates(rates), len(rates))
            spreads = (
                f" Each request draws its own AL from a spread over {spread.requests} requests "
                f"(step-weighted p0..p100 fitted to this mean: "
                f"{', '.join(f'{q:.3f}' for q in knots)}), then its own schedule at that AL."
            )
        return (
            f"Forced speculative acceptance ON: mean acceptance length "
            f"{length_from_rates(rates):.4f} over {self.num_speculative_tokens} draft positions "
            f"(per-position rates {rates}).{spreads} Throughput numbers from this run are "
            "synthetic; output text and accuracy are meaningless."
        )


def check_device(device: Any, dtype: Any = "float32") -> None:
    """Refuse a device torch cannot parse or this machine does not have, and a dtype that is
    not a torch floating type, before any model is built on them."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"--device {device}: expected cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {device}: CUDA is not available on this machine")
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(
                f"--device {device}: this machine has {count} CUDA device(s), cuda:0.."
                f"cuda:{count - 1}"
            )
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"--device {device}: MPS is not available on this machine")
    elif parsed.type != "cpu":
        raise ConfigError(f"--device {device}: expected cpu, cuda, cuda:N or mps")
    kind = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(kind, torch.dtype) or not kind.is_floating_point:
        raise ConfigError(f"dtype {dtype!r}: expected a torch floating type such as float32")


@dataclass
class EngineConfig:
    """Everything the engine needs; ``validate`` refuses a bad combination before any work."""

    model: str = "dummy"
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    executor: ExecutorName = "torch"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    block_size: int = BLOCK_SIZE
    #: KV capacity in tokens (per model); the block pool holds this many slots.
    kv_cache_tokens: int = 131072
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    step_cost: Pricing = field(default_factory=StepCost)
    #: Decode text as tokens arrive (off for the simulator: only counts and times matter).
    detokenize: bool = True
    #: Rank processes the model is split over (vLLM's ``--tensor-parallel-size``); see
    #: ``speclens.engine.parallel``.
    tensor_parallel_size: int = 1
    #: Ranks compare a checksum of their accepted counts every decode step (one all-reduce).
    debug_lockstep: bool = False

    def validate(self) -> None:
        spec = self.speculative
        if self.executor not in ("torch", "sim"):
            raise ConfigError(f"executor must be torch or sim, got {self.executor!r}")
        if self.executor == "torch" and spec.enabled and spec.method not in TORCH_METHODS:
            raise ConfigError(
                f"speculative method {spec.method!r} needs its own drafter; the torch executor "
                f"runs {' and '.join(TORCH_METHODS)} (the sim executor prices any method)"
            )
        if self.executor == "sim" and spec.draft_coverage < 1:
            raise ConfigError(
                "draft_coverage (--spec-decode-draft-coverage) needs the torch executor: the sim "
                "executor prices every step at K drafts (speclens sim states coverage in its "
                "scenario)"
            )
        if self.executor == "sim" and spec.enabled and not spec.forced:
            raise ConfigError(
                "the sim executor runs no model, so acceptance must be forced or stated: give "
                "--spec-decode-acceptance-length (or a rate, or an acceptance profile)"
            )
        for name in (
            "max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
            "kv_cache_tokens",
        ):  # fmt: skip
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        check_seed(self.seed)
        for problem in self.step_cost.problems():
            raise ConfigError(f"step_cost.{problem}")
        check_device(self.device, self.dtype)
        self._check_parallel()
        k = spec.num_speculative_tokens if spec.enabled else 0
        if self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} must be at least "
                f"max_model_len {self.max_model_len} (prefill is not chunked)"
            )
        if self.kv_cache_tokens < self.max_model_len + k + 1:
            raise ConfigError(
                f"kv_cache_tokens {self.kv_cache_tokens} cannot hold one request of "
                f"max_model_len {self.max_model_len} plus its {k + 1} verify slots"
            )

    def _check_parallel(self) -> None:
        size = self.tensor_parallel_size
        if not _is_int(size) or not 1 <= size <= MAX_TENSOR_PARALLEL:
            raise ConfigError(
                f"--tensor-parallel-size: expected an integer from 1 to {MAX_TENSOR_PARALLEL}, "
                f"got {size!r}"
            )
        if size > 1 and self.executor != "torch":
            raise ConfigError(
                f"--tensor-parallel-size {size}: expected the torch executor (the sim executor "
                f"runs no model to split)"
            )
        if not isinstance(self.debug_lockstep, bool):
            raise ConfigError(f"--debug-lockstep: expected a boolean, got {self.debug_lockstep!r}")
