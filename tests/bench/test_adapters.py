"""The engine adapters on recorded-style payloads, auto-detection, plugins, and fuzzing."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar

import payloads as P
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import speclens.bench.adapters as adapters_module
from speclens.bench.adapters import (
    BUILTIN_ADAPTERS,
    ENTRY_POINT_GROUP,
    Detection,
    SGLangSpecDecodeAdapter,
    SpecDecodeAdapter,
    TRTLLMSpecDecodeAdapter,
    VLLMMetricsAdapter,
    VLLMSpecDecodeAdapter,
    available_adapters,
    detect,
)
from speclens.bench.adapters._common import (
    BuiltinAdapter,
    choice_value,
    last_carrier,
    last_choice_value,
    pooled,
    present_keys,
)
from speclens.runs.record import DRAFT_UNITS, SpecDecodeAcceptanceRecord

Responses = list[dict[str, Any]]
BY_NAME = {a.name: a for a in BUILTIN_ADAPTERS}
STATUSES = {"ok", "absent", "malformed", "multiple_sequences", "conflict"}


def expected(name: str) -> dict[str, Any]:
    _, _, engine, overrides = P.VALID[name]
    extra = {"draft_unit": DRAFT_UNITS[engine], "acceptance_histogram_by_draft_length": None}
    return {"engine": engine, **P.EXPECTED_DEFAULTS, **extra, **overrides}


# --- every adapter on its own payloads ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(P.VALID))
def test_valid_payloads(name: str) -> None:
    make, adapter_name, _, _ = P.VALID[name]
    adapter = BY_NAME[adapter_name]
    assert adapter.can_adapt(make())
    record = adapter.adapt(make())
    assert record is not None
    got, want = record.model_dump(), expected(name)
    for key in ("mean_acceptance_length", "draft_acceptance_rate"):
        assert got.pop(key) == pytest.approx(want.pop(key), abs=1e-9)
    assert got == want
    found = detect(make())
    if name.startswith("speclens-both"):  # the root shape is the primary one (issue 14, item 6)
        adapter_name = "vllm-root-metrics"
    assert (found.status, found.adapter, found.message) == ("ok", adapter_name, None)
    assert found.record is not None and found.record.same_measurement(record)


@pytest.mark.parametrize("name", sorted(P.VALID))
def test_adapters_claim_only_their_own_shape(name: str) -> None:
    make, adapter_name, _, _ = P.VALID[name]
    claimants = {a.name for a in BUILTIN_ADAPTERS if a.can_adapt(make())}
    if name.startswith("speclens-both"):
        assert claimants == {"vllm-per-choice-stats", "vllm-root-metrics"}
    else:
        assert claimants == {adapter_name}


def test_adapting_leaves_the_payload_untouched() -> None:
    for make, _, _, _ in P.VALID.values():
        responses = make()
        before = copy.deepcopy(responses)
        detect(responses)
        assert responses == before


def test_builtin_adapters_satisfy_the_protocol() -> None:
    for adapter in BUILTIN_ADAPTERS:
        assert isinstance(adapter, SpecDecodeAdapter)
        assert isinstance(adapter.name, str) and isinstance(adapter.priority, int)
    assert [a.name for a in available_adapters()] == [
        "vllm-root-metrics",
        "vllm-per-choice-stats",
        "trtllm-per-choice",
        "sglang-meta-info",
        "llamacpp-timings",
    ]


def test_sglang_accept_length_is_not_copied() -> None:
    responses = P.sglang_chat()
    assert responses[0]["choices"][0]["meta_info"]["spec_accept_length"] == 3.0
    record = SGLangSpecDecodeAdapter.adapt(responses)
    assert record is not None and record.mean_acceptance_length == pytest.approx(2.8)
    assert record.completion_tokens == 15  # from usage, not meta_info


def test_sglang_native_stream_reads_the_last_cumulative_meta_info() -> None:
    record = SGLangSpecDecodeAdapter.adapt(P.sglang_native_stream())
    assert record is not None and record.num_spec_steps == 5


def test_completion_tokens_come_from_the_last_usage() -> None:
    record = VLLMSpecDecodeAdapter.adapt(P.vllm_completions_stream_detailed())
    assert record is not None and record.completion_tokens == 15


def test_vllm_metrics_reads_k_from_the_dense_length() -> None:
    responses = P.vllm_metrics_chat()
    spec = responses[0]["metrics"]["speculative_decoding"]
    assert "num_spec_tokens" not in spec
    spec["acceptance_histogram"] = [1, 1, 1, 2, 0, 0]
    record = VLLMMetricsAdapter.adapt(responses)
    assert record is not None and record.num_spec_tokens == 5


def test_vllm_metrics_derives_missing_figures() -> None:
    responses = P.vllm_metrics_chat()
    spec = responses[0]["metrics"]["speculative_decoding"]
    del spec["mean_acceptance_length"], spec["draft_acceptance_rate"]
    record = VLLMMetricsAdapter.adapt(responses)
    assert record is not None
    assert record.mean_acceptance_length == pytest.approx(2.8)
    assert record.draft_acceptance_rate == pytest.approx(0.6)


def test_vllm_metrics_accepts_both_spellings_when_they_agree() -> None:
    responses = P.vllm_metrics_chat()
    spec = responses[0]["metrics"]["speculative_decoding"]
    spec.update(num_spec_steps=5, num_accepted_draft_tokens=9, num_spec_tokens=3)
    assert VLLMMetricsAdapter.adapt(responses) is not None
    spec["num_spec_steps"] = 6
    assert VLLMMetricsAdapter.adapt(responses) is None


def test_trtllm_derives_mean_acceptance_length() -> None:
    responses = P.trtllm_chat()
    assert "mean_acceptance_length" not in responses[0]["choices"][0]["speculative_decoding"]
    record = TRTLLMSpecDecodeAdapter.adapt(responses)
    assert record is not None and record.mean_acceptance_length == pytest.approx(2.8)


# --- edge cases ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "adapter", "histogram", "mean"),
    [
        (P.vllm_zero_step, "vllm-per-choice-stats", {}, 1.0),
        (P.speclens_zero_step_both, "vllm-root-metrics", {}, 1.0),
        (P.sglang_zero_step, "sglang-meta-info", {}, 1.0),
        (P.vllm_fully_rejected, "vllm-per-choice-stats", {0: 4}, 1.0),
        (P.trtllm_fully_rejected, "trtllm-per-choice", {0: 4}, 1.0),
    ],
)
def test_zero_step_and_fully_rejected_are_reported_verbatim(
    make: Callable[[], Responses], adapter: str, histogram: dict[int, int], mean: float
) -> None:
    found = detect(make())
    assert found.status == "ok" and found.adapter == adapter
    assert found.record is not None
    assert found.record.acceptance_histogram == histogram
    assert found.record.mean_acceptance_length == mean
    assert found.record.draft_acceptance_rate == 0.0
    assert found.record.num_accepted_draft_tokens == 0


@pytest.mark.parametrize("make", [P.vllm_chat_n2, P.vllm_stream_n2, P.sglang_chat_n2])
def test_n_greater_than_one_is_suppressed(make: Callable[[], Responses]) -> None:
    """Root-level and whole-request shapes cannot say which sequence they count."""
    for adapter in BUILTIN_ADAPTERS:
        assert adapter.adapt(make()) is None
    found = detect(make())
    assert found.status == "multiple_sequences"
    assert found.record is None
    assert found.message is not None and "n > 1" in found.message


def test_trtllm_n_two_gives_each_choice_its_own_record_and_the_request_their_sum() -> None:
    """TensorRT-LLM's object is per sequence (``tensorrt_llm/serve/postprocess_handlers.py``
    builds each choice's from that choice's output), so n > 1 is read, not suppressed."""
    body = P.trtllm_n2()[0]
    second = body["choices"][1]["speculative_decoding"]
    second.update(
        total_accepted_draft_tokens=2, total_draft_tokens=9, num_spec_steps=3,
        acceptance_histogram=[1, 2, 0, 0], acceptance_rate=2 / 9,
    )  # fmt: skip
    alone = TRTLLMSpecDecodeAdapter.adapt(P.trtllm_chat())
    found = detect([body])
    assert found.status == "ok" and found.adapter == "trtllm-per-choice"
    assert found.choices is not None and sorted(found.choices) == [0, 1]
    first, other = found.choices[0], found.choices[1]
    assert alone is not None and first.num_spec_steps == alone.num_spec_steps
    assert first.acceptance_histogram == alone.acceptance_histogram
    assert (other.num_spec_steps, other.num_accepted_draft_tokens) == (3, 2)
    assert other.acceptance_histogram == {0: 1, 1: 2}
    assert first.completion_tokens is None  # usage covers both choices
    total = found.record
    assert total is not None and total.completion_tokens == alone.completion_tokens
    assert total.num_spec_steps == first.num_spec_steps + 3
    assert total.num_draft_tokens == first.num_draft_tokens + 9
    hist = dict(first.acceptance_histogram or {})
    hist[0] = hist.get(0, 0) + 1
    hist[1] = hist.get(1, 0) + 2
    assert total.acceptance_histogram == {j: n for j, n in sorted(hist.items()) if n}
    assert total.draft_unit == "paths" and other.draft_unit == "paths"


def test_trtllm_only_tokens_per_iteration_makes_no_record_and_says_why() -> None:
    body = P.trtllm_chat()[0]
    del body["choices"][0]["speculative_decoding"]
    body["choices"][0]["avg_decoded_tokens_per_iter"] = 2.5
    found = detect([body])
    assert found.status == "absent" and found.record is None
    assert found.message is not None and "avg_decoded_tokens_per_iter (2.5)" in found.message
    assert "not AL" in found.message


def test_our_server_with_n_two_sends_nothing_so_it_is_absent() -> None:
    found = detect(P.speclens_n2())
    assert found.status == "absent" and found.claimed_by == []
    assert found.message is not None and "2 sequences" in found.message


def test_a_two_choice_body_is_n_two_even_without_indices() -> None:
    body = P.vllm_chat_n2()[0]
    for choice in body["choices"]:
        del choice["index"]
    assert detect([body]).status == "multiple_sequences"


@pytest.mark.parametrize(
    "make", [P.spec_decode_off, P.spec_decode_null, P.speclens_n2, lambda: [], lambda: [{}]]
)
def test_absent(make: Callable[[], Responses]) -> None:
    found = detect(make())
    assert found == Detection(None, None, "absent", found.message, [])


# --- malformed payloads -------------------------------------------------------------------------


def _stats(r: Responses) -> dict[str, Any]:
    obj: dict[str, Any] = r[0]["choices"][0]["speculative_decoding_stats"]
    return obj


def _root(r: Responses) -> dict[str, Any]:
    obj: dict[str, Any] = r[0]["metrics"]["speculative_decoding"]
    return obj


def _trt(r: Responses) -> dict[str, Any]:
    obj: dict[str, Any] = r[0]["choices"][0]["speculative_decoding"]
    return obj


def _meta(r: Responses) -> dict[str, Any]:
    obj: dict[str, Any] = r[0]["choices"][0]["meta_info"]
    return obj


def _set(get: Callable[[Responses], dict[str, Any]], **values: Any) -> Callable[[Responses], None]:
    def mutate(r: Responses) -> None:
        get(r).update(values)

    return mutate


def _drop(get: Callable[[Responses], dict[str, Any]], key: str) -> Callable[[Responses], None]:
    def mutate(r: Responses) -> None:
        del get(r)[key]

    return mutate


def _replace(get: Callable[[Responses], Any], key: str, value: Any) -> Callable[[Responses], None]:
    def mutate(r: Responses) -> None:
        get(r)[key] = value

    return mutate


MALFORMED: dict[str, tuple[Callable[[], Responses], Callable[[Responses], None], str]] = {
    # vLLM per-choice object
    "stats-not-an-object": (
        P.vllm_chat_summary,
        _replace(lambda r: r[0]["choices"][0], "speculative_decoding_stats", [1, 2]),
        "not an object",
    ),
    "hist-not-summing": (
        P.vllm_chat_summary,
        _set(_stats, acceptance_histogram={"0": 2, "1": 1, "2": 1, "3": 2}),
        "sums to 6 steps",
    ),
    "accepted-over-drafted": (
        P.vllm_chat_summary,
        _set(_stats, num_draft_tokens=8, draft_acceptance_rate=9 / 8),
        "exceed",
    ),
    "bad-mean": (P.vllm_chat_summary, _set(_stats, mean_acceptance_length=3.78), "mean"),
    "nan-mean": (P.vllm_chat_summary, _set(_stats, mean_acceptance_length=math.nan), "finite"),
    "inf-rate": (P.vllm_chat_summary, _set(_stats, draft_acceptance_rate=math.inf), "finite"),
    "negative-steps": (P.vllm_chat_summary, _set(_stats, num_spec_steps=-5), "out of range"),
    "string-count": (P.vllm_chat_summary, _set(_stats, num_draft_tokens="15"), "not an integer"),
    "float-count": (P.vllm_chat_summary, _set(_stats, num_draft_tokens=15.0), "not an integer"),
    "bool-count": (P.vllm_chat_summary, _set(_stats, num_spec_tokens=True), "not an integer"),
    "huge-count": (P.vllm_chat_summary, _set(_stats, num_draft_tokens=10**400), "out of range"),
    "string-mean": (P.vllm_chat_summary, _set(_stats, mean_acceptance_length="2.8"), "number"),
    "bad-key": (
        P.vllm_chat_summary,
        _set(_stats, acceptance_histogram={"0": 1, "1": 1, "2": 1, "three": 2}),
        "not a count",
    ),
    "negative-key": (
        P.vllm_chat_summary,
        _set(_stats, acceptance_histogram={"0": 1, "1": 1, "2": 1, "-3": 2}),
        "not a count",
    ),
    "duplicate-key": (
        P.vllm_chat_summary,
        _set(_stats, acceptance_histogram={"0": 1, "1": 1, "2": 1, "3": 1, "03": 1}),
        "not a count",
    ),
    "key-over-k": (P.vllm_chat_summary, _set(_stats, num_spec_tokens=2), "K = 2"),
    "missing-k": (P.vllm_chat_summary, _drop(_stats, "num_spec_tokens"), "missing"),
    "missing-histogram": (P.vllm_chat_summary, _drop(_stats, "acceptance_histogram"), "missing"),
    "missing-mean": (P.vllm_chat_summary, _drop(_stats, "mean_acceptance_length"), "missing"),
    "per-step-alone": (
        P.vllm_completions_detailed,
        _drop(_stats, "per_step_drafted"),
        "together",
    ),
    "per-step-short": (
        P.vllm_completions_detailed,
        _set(_stats, per_step_accepted=[3, 1, 0, 2], per_step_drafted=[3, 3, 3, 3]),
        "not num_spec_steps",
    ),
    "per-step-not-a-list": (
        P.vllm_completions_detailed,
        _set(_stats, per_step_accepted="31023"),
        "not an array",
    ),
    "per-step-contradicts-histogram": (
        P.vllm_completions_detailed,
        _set(_stats, per_step_accepted=[2, 2, 0, 2, 3]),
        "not the count",
    ),
    "usage-not-an-object": (
        P.vllm_chat_summary,
        _replace(lambda r: r[0], "usage", "15 tokens"),
        "usage",
    ),
    "usage-bad-completion-tokens": (
        P.vllm_chat_summary,
        _replace(lambda r: r[0]["usage"], "completion_tokens", -1),
        "usage.completion_tokens",
    ),
    # vLLM merged shape
    "root-not-an-object": (
        P.vllm_metrics_chat,
        _replace(lambda r: r[0]["metrics"], "speculative_decoding", "on"),
        "not an object",
    ),
    "root-hist-a-map": (
        P.vllm_metrics_chat,
        _set(_root, acceptance_histogram={"0": 1, "1": 1, "2": 1, "3": 2}),
        "not an array",
    ),
    "root-hist-too-short": (P.vllm_metrics_chat, _set(_root, acceptance_histogram=[5]), "no K"),
    "root-hist-wrong-length": (
        P.vllm_metrics_chat,
        _set(_root, num_spec_tokens=4),
        "not K + 1 = 5",
    ),
    "root-missing-steps": (P.vllm_metrics_chat, _drop(_root, "num_drafts"), "num_drafts"),
    "root-missing-drafted": (P.vllm_metrics_chat, _drop(_root, "num_draft_tokens"), "missing"),
    "root-negative-bucket": (
        P.vllm_metrics_chat,
        _set(_root, acceptance_histogram=[1, 1, 1, -2]),
        "out of range",
    ),
    # TensorRT-LLM
    "trt-bad-rate": (P.trtllm_chat, _set(_trt, acceptance_rate=0.9), "draft_acceptance_rate"),
    "trt-hist-not-summing": (
        P.trtllm_chat,
        _set(_trt, acceptance_histogram=[1, 1, 1, 3]),
        "sums to 6",
    ),
    "trt-missing-steps": (P.trtllm_chat, _drop(_trt, "num_spec_steps"), "missing"),
    "trt-null-histogram": (P.trtllm_chat, _set(_trt, acceptance_histogram=None), "missing"),
    # SGLang
    "sglang-no-histogram": (
        P.sglang_chat,
        _drop(_meta, "spec_accept_histogram"),
        "no spec_accept_histogram",
    ),
    "sglang-no-counts": (
        P.sglang_chat,
        _drop(_meta, "spec_accept_token_num"),
        "spec_accept_token_num",
    ),
    "sglang-spellings-disagree": (
        P.sglang_chat,
        _set(_meta, spec_num_accepted_tokens=8),
        "disagree",
    ),
    "sglang-histograms-disagree": (
        P.sglang_native,
        _replace(lambda r: r[0]["meta_info"], "spec_accept_histogram", [2, 1, 1, 1]),
        "disagree",
    ),
    "sglang-accepted-over-drafted": (
        P.sglang_chat,
        _set(_meta, spec_draft_token_num=4),
        "exceed",
    ),
    "sglang-only-accept-length": (
        P.sglang_chat,
        lambda r: r[0]["choices"][0].update(meta_info={"spec_accept_length": 3.0}),
        "spec_verify_ct is missing",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_payloads(case: str) -> None:
    make, mutate, reason = MALFORMED[case]
    responses = make()
    mutate(responses)
    found = detect(responses)
    assert found.status == "malformed", found
    assert found.record is None
    assert found.adapter in BY_NAME
    assert found.claimed_by == [found.adapter]
    assert found.message is not None and reason in found.message
    assert BY_NAME[found.adapter].adapt(responses) is None


def test_a_malformed_stream_chunk_is_reported() -> None:
    chunks = P.vllm_chat_stream_summary()
    chunks[-2]["choices"][0]["speculative_decoding_stats"]["num_spec_steps"] = 4
    assert detect(chunks).status == "malformed"


# --- several claimants --------------------------------------------------------------------------


def test_both_shapes_agree() -> None:
    found = detect(P.speclens_both_chat())
    assert found.status == "ok"
    assert found.adapter == "vllm-root-metrics"
    assert found.claimed_by == ["vllm-root-metrics", "vllm-per-choice-stats"]
    alone = VLLMSpecDecodeAdapter.adapt(P.speclens_both_chat())
    assert alone is not None and found.record is not None
    assert found.record.same_measurement(alone)


def test_both_shapes_disagree_is_a_conflict() -> None:
    responses = P.speclens_both_chat()
    _root(responses).update(
        acceptance_histogram=[1, 1, 2, 1],
        num_accepted_draft_tokens=8,
        mean_acceptance_length=2.6,
        draft_acceptance_rate=8 / 15,
        per_step_accepted=[3, 1, 0, 2, 2],
    )
    assert VLLMMetricsAdapter.adapt(responses) is not None
    found = detect(responses)
    assert found.status == "conflict"
    assert found.record is None and found.adapter is None
    assert found.claimed_by == ["vllm-root-metrics", "vllm-per-choice-stats"]
    assert found.message is not None
    assert "vllm-root-metrics and vllm-per-choice-stats disagree" in found.message
    assert "num_accepted_draft_tokens (8 vs 9)" in found.message
    assert "reported, not guessed" in found.message


def test_one_shape_malformed_the_other_fine_is_a_conflict() -> None:
    responses = P.speclens_both_chat()
    _root(responses)["num_spec_steps"] = "five"
    found = detect(responses)
    assert found.status == "conflict"
    assert found.message is not None
    assert "vllm-per-choice-stats read a record but vllm-root-metrics did not" in found.message


def test_both_shapes_malformed_is_malformed() -> None:
    responses = P.speclens_both_chat()
    _root(responses)["num_spec_steps"] = 4
    _stats(responses)["num_spec_steps"] = 4
    found = detect(responses)
    assert found.status == "malformed"
    assert found.adapter == "vllm-root-metrics"
    assert found.claimed_by == ["vllm-root-metrics", "vllm-per-choice-stats"]


def test_both_shapes_agree_in_a_stream() -> None:
    found = detect(P.speclens_both_completions_stream())
    assert found.status == "ok"
    assert found.claimed_by == ["vllm-root-metrics", "vllm-per-choice-stats"]


# --- custom adapters and priority ----------------------------------------------------------------


def _record(engine: str, steps: int) -> SpecDecodeAcceptanceRecord:
    """Every step accepted one of two drafts."""
    return SpecDecodeAcceptanceRecord(
        engine=engine,
        mean_acceptance_length=2.0,
        draft_acceptance_rate=0.5,
        acceptance_histogram={1: steps},
        num_accepted_draft_tokens=steps,
        num_draft_tokens=2 * steps,
        num_spec_steps=steps,
    )


class XSpec:
    """A third-party engine's shape: a root ``x_spec`` object holding a step count."""

    name: ClassVar[str] = "x-engine"
    priority: ClassVar[int] = 50
    engine: ClassVar[str] = "x"

    @classmethod
    def can_adapt(cls, responses: Responses) -> bool:
        return any(isinstance(r, dict) and "x_spec" in r for r in responses)

    @classmethod
    def adapt(cls, responses: Responses) -> SpecDecodeAcceptanceRecord | None:
        return _record(cls.engine, 2)


def _adapter(name: str, priority: int, result: Any = None, claims: Any = True) -> Any:
    """A throwaway adapter class; ``result``/``claims`` may be an exception to raise."""

    def can_adapt(cls: Any, responses: Responses) -> Any:
        if isinstance(claims, BaseException):
            raise claims
        return claims

    def adapt(cls: Any, responses: Responses) -> Any:
        if isinstance(result, BaseException):
            raise result
        return result

    return type(
        name,
        (),
        {
            "name": name,
            "priority": priority,
            "can_adapt": classmethod(can_adapt),
            "adapt": classmethod(adapt),
        },
    )


def test_priority_orders_the_walk_and_picks_the_winner() -> None:
    late = _adapter("late", 900, _record("late", 2))
    early = _adapter("early", 1, _record("other", 2))
    found = detect([{"x_spec": {}}], adapters=[late, XSpec, early])
    assert found.status == "ok"
    assert found.claimed_by == ["early", "x-engine", "late"]
    assert found.adapter == "early"
    assert found.record is not None and found.record.engine == "other"


def test_ties_in_priority_break_by_name() -> None:
    rec = _record("e", 2)
    found = detect([{}], adapters=[_adapter("b", 5, rec), _adapter("a", 5, rec)])
    assert found.claimed_by == ["a", "b"] and found.adapter == "a"


def test_disagreeing_custom_adapters_conflict() -> None:
    found = detect(
        [{}], adapters=[_adapter("one", 1, _record("e", 2)), _adapter("two", 2, _record("e", 3))]
    )
    assert found.status == "conflict"
    assert found.message is not None and "one and two disagree" in found.message


@pytest.mark.parametrize(
    ("adapter", "reason"),
    [
        (_adapter("boom", 1, claims=RuntimeError("claim")), "can_adapt raised RuntimeError"),
        (_adapter("bang", 1, result=KeyError("k")), "adapt raised KeyError"),
        (_adapter("odd", 1, result={"not": "a record"}), "returned a dict"),
        (_adapter("none", 1, result=None), "adapt returned None"),
        (_adapter("weird", 1, claims=float("nan")), "adapt returned None"),
    ],
)
def test_misbehaving_adapters_are_reported_not_raised(adapter: Any, reason: str) -> None:
    found = detect(P.spec_decode_off(), adapters=[adapter])
    assert found.status == "malformed"
    assert found.message is not None and reason in found.message


def test_an_adapter_without_priority_runs_last() -> None:
    nameless = _adapter("z", 0, _record("z", 2))
    del nameless.priority
    found = detect([{"x_spec": 1}], adapters=[nameless, XSpec])
    assert found.claimed_by == ["x-engine", "z"]


def test_no_adapters_means_absent() -> None:
    assert detect(P.vllm_chat_summary(), adapters=[]).status == "absent"


# --- entry-point plugins ------------------------------------------------------------------------


class FakeEntryPoint:
    def __init__(self, name: str, load: Callable[[], Any]) -> None:
        self.name, self.value, self.group = name, f"thirdparty:{name}", ENTRY_POINT_GROUP
        self._load = load

    def load(self) -> Any:
        return self._load()


def _missing_module() -> Any:
    raise ModuleNotFoundError("No module named 'thirdparty_spec'")


class NoMethods:
    name = "no-methods"
    priority = 5


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[FakeEntryPoint]], None]:
    """Install fake entry points; the discovery cache is restored afterwards."""
    monkeypatch.setattr(adapters_module, "_discovered", None)

    def install(points: list[FakeEntryPoint]) -> None:
        def fake_entry_points(**kwargs: Any) -> list[FakeEntryPoint]:
            assert kwargs == {"group": ENTRY_POINT_GROUP}
            return points

        monkeypatch.setattr(adapters_module, "entry_points", fake_entry_points)

    return install


def test_a_plugin_is_picked_up_in_priority_order(
    plugins: Callable[[list[FakeEntryPoint]], None],
) -> None:
    between = _adapter("between", 105, None, claims=False)
    plugins([FakeEntryPoint("x", lambda: XSpec), FakeEntryPoint("between", lambda: between)])
    names = [a.name for a in available_adapters(refresh=True)]
    assert names == [
        "x-engine",
        "vllm-root-metrics",
        "between",
        "vllm-per-choice-stats",
        "trtllm-per-choice",
        "sglang-meta-info",
        "llamacpp-timings",
    ]
    found = detect([{"id": "r1", "x_spec": {"steps": 2}}])
    assert found.status == "ok" and found.adapter == "x-engine"
    assert found.record is not None and found.record.engine == "x"
    assert detect(P.vllm_chat_summary()).adapter == "vllm-per-choice-stats"


def test_broken_plugins_are_skipped_with_a_warning(
    plugins: Callable[[list[FakeEntryPoint]], None], caplog: pytest.LogCaptureFixture
) -> None:
    bad_priority = _adapter("bad-priority", 1)
    bad_priority.priority = "high"
    plugins(
        [
            FakeEntryPoint("missing", _missing_module),
            FakeEntryPoint("exits", lambda: (_ for _ in ()).throw(SystemExit(3))),
            FakeEntryPoint("no-methods", lambda: NoMethods),
            FakeEntryPoint("bad-priority", lambda: bad_priority),
            FakeEntryPoint("duplicate", lambda: _adapter("vllm-per-choice-stats", 0)),
            FakeEntryPoint("x", lambda: XSpec),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="speclens.bench.adapters"):
        adapters = available_adapters(refresh=True)
    assert adapters[0].name == "x-engine"
    assert len(adapters) == len(BUILTIN_ADAPTERS) + 1
    text = caplog.text
    assert "missing" in text and "ModuleNotFoundError" in text
    assert "exits" in text and "SystemExit" in text
    assert "no-methods" in text and "lacks" in text
    assert "bad-priority" in text and "not an integer" in text
    assert "already taken" in text


def test_a_failing_entry_point_scan_falls_back_to_the_builtins(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(adapters_module, "_discovered", None)

    def broken(**kwargs: Any) -> Any:
        raise OSError("unreadable metadata")

    monkeypatch.setattr(adapters_module, "entry_points", broken)
    with caplog.at_level(logging.WARNING, logger="speclens.bench.adapters"):
        assert available_adapters(refresh=True) == list(BUILTIN_ADAPTERS)
    assert "unreadable metadata" in caplog.text


def test_discovery_is_cached(plugins: Callable[[list[FakeEntryPoint]], None]) -> None:
    plugins([])
    first = available_adapters()
    plugins([FakeEntryPoint("x", lambda: XSpec)])
    assert available_adapters() == first
    assert "x-engine" in [a.name for a in available_adapters(refresh=True)]


# --- our own server's payload builders (skipped without the engine extra) -------------------------


def test_speclens_server_payloads_agree() -> None:
    pytest.importorskip("torch")
    from speclens.engine import RequestAcceptance
    from speclens.server.protocol import choice_stats, root_metrics

    acceptance = RequestAcceptance(num_spec_tokens=4)
    for drafted, accepted in [(4, 4), (4, 0), (3, 2), (0, 0), (4, 1), (2, 2)]:
        acceptance.record(drafted, accepted)
    for level in ("summary", "detailed"):
        body = {
            "object": "chat.completion",
            "choices": [
                {"index": 0, "speculative_decoding_stats": choice_stats(acceptance, level)}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 14, "total_tokens": 17},
            "metrics": root_metrics(acceptance, level),
        }
        found = detect([body])
        assert found.status == "ok", found.message
        assert found.claimed_by == ["vllm-root-metrics", "vllm-per-choice-stats"]
        assert found.record is not None
        assert found.record.acceptance_histogram == {0: 1, 1: 1, 2: 2, 4: 1}
        assert found.record.num_spec_steps == 5
        assert (found.record.per_step_accepted is not None) == (level == "detailed")


# --- fuzz: detect never raises ------------------------------------------------------------------

SPEC_KEYS = [
    "choices",
    "index",
    "usage",
    "completion_tokens",
    "metrics",
    "meta_info",
    "speculative_decoding",
    "speculative_decoding_stats",
    "acceptance_histogram",
    "spec_accept_histogram",
    "num_spec_steps",
    "num_spec_tokens",
    "spec_verify_ct",
    "mean_acceptance_length",
    "per_step_accepted",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5)
    | st.sampled_from(["0", "1", "01", "-1", "3"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(SPEC_KEYS) | st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=30,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(responses: Any) -> None:
    found = detect(responses)
    assert isinstance(found, Detection)
    assert found.status in STATUSES
    assert (found.record is not None) == (found.status == "ok")
    for adapter in BUILTIN_ADAPTERS:
        adapter.can_adapt(responses)
        record = adapter.adapt(responses)
        assert record is None or isinstance(record, SpecDecodeAcceptanceRecord)


@FUZZ
@given(st.lists(json_values, max_size=4) | json_values)
def test_fuzz_arbitrary_json_never_raises(responses: Any) -> None:
    _check(responses)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


ALL_VALID = [make for make, _, _, _ in P.VALID.values()] + [
    P.vllm_zero_step,
    P.vllm_fully_rejected,
    P.speclens_zero_step_both,
    P.trtllm_fully_rejected,
    P.sglang_zero_step,
    P.vllm_chat_n2,
]


@FUZZ
@given(st.sampled_from(ALL_VALID), st.data())
def test_fuzz_mutated_fixtures_never_raise(
    make: Callable[[], Responses], data: st.DataObject
) -> None:
    responses = make()
    paths = _paths(responses)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent: Any = responses
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(json_values)
        paths = _paths(responses)
        if not paths:
            break
    _check(responses)


# --- decode steps: read when the engine reports them, never derived ------------------------------


def _with_decode_steps(choice: object, root: object) -> Responses:
    """Our server's response (both shapes, detailed) of a request with 7 decode steps, 5 of which
    drafted: 1 prefill token + 2 undrafted steps + 5 verify steps emitting 9 accepted + 5 = 17."""
    body = P.speclens_both_chat()[0]
    body["usage"] = {"prompt_tokens": 24, "completion_tokens": 17, "total_tokens": 41}
    for spec, value in (
        (body["choices"][0]["speculative_decoding_stats"], choice),
        (body["metrics"]["speculative_decoding"], root),
    ):
        if value is not None:
            spec["num_decode_steps"] = value
    return [body]


def test_decode_steps_from_our_server_give_draft_coverage() -> None:
    found = detect(_with_decode_steps(7, 7))
    assert found.status == "ok", found.message
    assert sorted(found.claimed_by) == ["vllm-per-choice-stats", "vllm-root-metrics"]
    assert found.record is not None
    assert found.record.num_decode_steps == 7
    assert found.record.draft_coverage == 5 / 7
    root = VLLMMetricsAdapter.adapt(_with_decode_steps(None, 7))
    assert root is not None and root.num_decode_steps == 7


def test_decode_steps_are_never_derived_from_vllm_payloads() -> None:
    """vLLM 0.32 lists verify steps only (``RequestSpecDecodeMetrics.observe`` runs under
    ``if scheduled_spec_token_ids``), so neither its per-step arrays nor usage give the count."""
    for make in (P.vllm_completions_detailed, P.vllm_metrics_chat, P.trtllm_chat, P.sglang_chat):
        found = detect(make())
        assert found.status == "ok" and found.record is not None
        assert found.record.num_decode_steps is None
        assert found.record.draft_coverage is None


def test_shapes_disagreeing_on_decode_steps_conflict() -> None:
    found = detect(_with_decode_steps(7, 8))
    assert found.status == "conflict" and found.record is None
    assert found.message is not None and "num_decode_steps" in found.message


@pytest.mark.parametrize(
    ("value", "why"),
    [("7", "not an integer"), (True, "not an integer"), (-1, "out of range"), (4, "below")],
)
def test_bad_decode_steps_are_malformed(value: object, why: str) -> None:
    for adapter in (VLLMSpecDecodeAdapter, VLLMMetricsAdapter):
        record, message = adapter.diagnose(_with_decode_steps(value, value))
        assert record is None and message is not None and why in message, message


# --- markers: detection skips a shape only when its reader would not claim ---------------------

# Every shape's field names, written out (not taken from the markers under test).
_KEYS = ["choices", "index", "usage", "metrics", "speculative_decoding", "timings", "draft_n"]
_KEYS += ["draft_n_accepted", "meta_info", "sglext", "spec_tokens_details", "spec_verify_ct"]
_KEYS += ["spec_accept_length", "speculative_decoding_stats"]
# Nested objects whose keys come from every shape's vocabulary, so that the shapes' own nestings
# (``sglext.spec_tokens_details.spec_verify_ct``, ``metrics.speculative_decoding``) turn up.
_VALUES = st.recursive(
    st.none() | st.integers(0, 3),
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.dictionaries(st.sampled_from(_KEYS), inner, min_size=1, max_size=3)
    ),
    max_leaves=6,
)
_CHOICE = st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=3)
_ROOT = st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=3).flatmap(
    lambda root: (
        st.lists(_CHOICE, max_size=2).map(lambda c: {**root, "choices": c})
        if "choices" in root
        else st.just(root)
    )
)
_RESPONSES = st.lists(_ROOT, min_size=1, max_size=3)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_RESPONSES)
@example([{"metrics": {"speculative_decoding": {"num_drafts": 1}}}])
@example([{"timings": {"draft_n": 3}}])
@example([{"meta_info": {"spec_verify_ct": 1}}])
@example([{"choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": 1}}}])
@example([{"choices": [{"meta_info": {"spec_verify_ct": 1}}]}])
@example([{"choices": [{"speculative_decoding_stats": {}}]}])
@example([{"choices": [{"speculative_decoding": {}}]}])
def test_a_shape_is_skipped_only_when_it_could_not_claim(responses: Responses) -> None:
    keys = present_keys(responses)
    for adapter in BUILTIN_ADAPTERS:
        if adapter.can_adapt(responses):
            assert adapter.may_claim(keys), adapter.name


def _all_payloads() -> list[Responses]:
    out = [make() for make, *_ in P.VALID.values()]
    for make, breaks, _ in MALFORMED.values():
        responses = make()
        breaks(responses)
        out.append(responses)
    return out


@pytest.mark.parametrize("index", range(len(P.VALID) + len(MALFORMED)))
def test_skipping_by_markers_changes_no_detection(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    responses = _all_payloads()[index]
    keys = present_keys(responses)
    assert any(a.may_claim(keys) for a in BUILTIN_ADAPTERS)
    fast = detect(copy.deepcopy(responses))
    monkeypatch.setattr(BuiltinAdapter, "may_claim", classmethod(lambda cls, keys: True))
    assert detect(copy.deepcopy(responses)) == fast


# --- the one "last carrier" lookup (issue 19, item 21) -------------------------------------------


def test_last_choice_value_takes_the_last_carrier() -> None:
    """Kills the mutation: ``last_choice_value`` taking the first carrier instead of the last
    (across objects, and across the choices of one object)."""
    responses = [
        {"choices": [{"index": 0, "x": 1}]},
        {"choices": [{"index": 0, "x": None}]},
        {"choices": [{"index": 0, "x": 2}, {"index": 1, "x": 3}]},
        {"choices": [{"index": 0}]},
    ]
    assert last_choice_value(responses, "x") == (True, 3)
    assert last_carrier(responses, choice_value("x", 0)) == (True, 2)
    assert last_choice_value(responses[:2], "x") == (True, 1)
    assert last_choice_value(responses[3:], "x") == (False, None)


def test_a_stream_resending_stats_is_read_at_its_last_carrier() -> None:
    """Kills the mutation: ``last_choice_value`` taking the first carrier; a cumulative re-send
    of the per-choice stats supersedes the earlier, partial one."""
    responses = P.vllm_chat_stream_summary()
    earlier = copy.deepcopy(responses[-2])
    stats = _stats([earlier])
    stats.update(
        num_spec_steps=1, num_accepted_draft_tokens=0, num_draft_tokens=3,
        acceptance_histogram={"0": 1}, mean_acceptance_length=1.0, draft_acceptance_rate=0.0,
    )  # fmt: skip
    record = VLLMSpecDecodeAdapter.adapt([earlier, *responses])
    assert record is not None and record.num_spec_steps == 5


def test_sglang_meta_info_wins_over_a_later_sglext() -> None:
    """Kills the mutation: SGLang's ``sglext`` winning over ``meta_info`` (sglext is a copy with
    defaults filled in, so SGLang's own dict is the one read even when sglext comes later)."""
    details = {"spec_verify_ct": 2, "spec_accepted_drafts": 1, "spec_proposed_drafts": 6,
               "spec_accept_histogram": [1, 1]}  # fmt: skip
    responses = [*P.sglang_chat(), {"choices": [], "sglext": {"spec_tokens_details": details}}]
    record = SGLangSpecDecodeAdapter.adapt(responses)
    assert record is not None and record.num_spec_steps == 5
    assert record.num_accepted_draft_tokens == 9
    alone = SGLangSpecDecodeAdapter.adapt(responses[1:])
    assert alone is not None and alone.num_spec_steps == 2


def test_pooled_choices_sum_their_decode_steps() -> None:
    """Kills the mutation: per-choice ``num_decode_steps`` pooled as the max instead of the sum
    (each sequence takes its own decode steps)."""

    def one(steps: int, accepted: int, decode: int) -> SpecDecodeAcceptanceRecord:
        return SpecDecodeAcceptanceRecord(
            engine="vllm", mean_acceptance_length=1 + accepted / steps,
            draft_acceptance_rate=accepted / (3 * steps), acceptance_histogram={1: accepted,
            0: steps - accepted}, num_accepted_draft_tokens=accepted, num_draft_tokens=3 * steps,
            num_spec_steps=steps, num_spec_tokens=3, num_decode_steps=decode,
        )  # fmt: skip

    total = pooled("vllm", {0: one(4, 2, 7), 1: one(5, 3, 6)}, [])
    assert total.num_decode_steps == 13
    assert total.num_spec_steps == 9
    assert total.mean_acceptance_length == pytest.approx(1 + 5 / 9)
