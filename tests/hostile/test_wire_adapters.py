"""Issue 14's reproductions for the wire adapters, each failing before its fix: llama.cpp's
counts-only ``timings``, TensorRT-LLM's per-choice stats for n > 1 and its drained JSON
``/metrics``, draft units that differ, and the primary vLLM shape. Detection never raises and a
malformed payload never aborts a run: it becomes a status with a reason."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest

from speclens.bench.adapters import detect
from speclens.bench.client import RequestRecord
from speclens.bench.server import parse_metrics
from speclens.runs.figures import acceptance
from speclens.runs.record import SpecDecodeAcceptanceRecord

USAGE = {"prompt_tokens": 5, "completion_tokens": 24, "total_tokens": 29}


def llamacpp(**timings: Any) -> list[dict[str, Any]]:
    """A llama-server ``/v1/completions`` body (b11434): ``timings`` at the root."""
    return [
        {
            "choices": [{"text": "x", "index": 0, "logprobs": None, "finish_reason": "length"}],
            "object": "text_completion", "model": "smollm2-135m", "usage": dict(USAGE),
            "timings": {"prompt_n": 5, "predicted_n": 24, **timings},
        }
    ]  # fmt: skip


def trtllm(*specs: dict[str, Any] | None) -> list[dict[str, Any]]:
    choices = []
    for i, spec in enumerate(specs):
        choice: dict[str, Any] = {"index": i, "text": "x", "finish_reason": "length",
                                  "avg_decoded_tokens_per_iter": 2.0}  # fmt: skip
        if spec is not None:
            choice["speculative_decoding"] = spec
        choices.append(choice)
    return [{"object": "text_completion", "model": "t", "choices": choices, "usage": dict(USAGE)}]


def trt_spec(steps: int, hist: list[int], drafted: int, k: int = 3) -> dict[str, Any]:
    accepted = sum(j * n for j, n in enumerate(hist))
    return {"total_accepted_draft_tokens": accepted, "total_draft_tokens": drafted,
            "num_spec_steps": steps, "acceptance_histogram": hist, "num_spec_tokens": k}  # fmt: skip


# --- llama.cpp ----------------------------------------------------------------------------------


def test_llamacpp_timings_give_a_counts_only_record_with_nothing_made_up() -> None:
    """Before: no adapter read ``timings``, so every llama.cpp request was 'absent'."""
    found = detect(llamacpp(draft_n=18, draft_n_accepted=12))
    assert found.status == "ok" and found.adapter == "llamacpp-timings"
    record = found.record
    assert record is not None and record.counts_only
    assert (record.num_draft_tokens, record.num_accepted_draft_tokens) == (18, 12)
    assert record.draft_acceptance_rate == pytest.approx(12 / 18)
    assert record.num_spec_steps is None and record.acceptance_histogram is None
    assert record.mean_acceptance_length is None and record.histogram is None
    assert record.completion_tokens == 24


def test_llamacpp_without_drafts_sends_no_draft_fields_and_is_absent() -> None:
    assert detect(llamacpp()).status == "absent"


@pytest.mark.parametrize(
    ("timings", "why"),
    [
        ({"draft_n": 4, "draft_n_accepted": 5}, "exceed"),
        ({"draft_n": "18", "draft_n_accepted": 3}, "not an integer"),
        ({"draft_n_accepted": 3}, "timings.draft_n is missing"),
        ({"draft_n": 2**64, "draft_n_accepted": 3}, "out of range"),
        ({"draft_n": True, "draft_n_accepted": 0}, "not an integer"),
    ],
)
def test_malformed_llamacpp_timings_are_reported_not_raised(
    timings: dict[str, Any], why: str
) -> None:
    found = detect(llamacpp(**timings))
    assert found.status == "malformed" and found.record is None
    assert found.message is not None and why in found.message


def test_llamacpp_n_two_is_suppressed() -> None:
    """llama-server merges n > 1 bodies keeping the first sequence's ``timings`` only."""
    responses = llamacpp(draft_n=8, draft_n_accepted=4)
    responses[0]["choices"].append({"text": "y", "index": 1, "finish_reason": "length"})
    assert detect(responses).status == "multiple_sequences"


def test_a_counts_only_record_cannot_carry_an_al_or_a_histogram() -> None:
    base = {"engine": "llama.cpp", "draft_acceptance_rate": 0.5, "num_accepted_draft_tokens": 2,
            "num_draft_tokens": 4, "num_spec_steps": None}  # fmt: skip
    with pytest.raises(pydantic.ValidationError, match="given without num_spec_steps"):
        SpecDecodeAcceptanceRecord(**base, mean_acceptance_length=2.0, acceptance_histogram=None)
    with pytest.raises(pydantic.ValidationError, match="given without num_spec_steps"):
        SpecDecodeAcceptanceRecord(**base, mean_acceptance_length=None, acceptance_histogram={2: 1})
    with pytest.raises(pydantic.ValidationError, match="mean_acceptance_length is missing"):
        SpecDecodeAcceptanceRecord(**{**base, "num_spec_steps": 2}, mean_acceptance_length=None,
                                   acceptance_histogram=None)  # fmt: skip


# --- TensorRT-LLM n > 1 -------------------------------------------------------------------------


def test_trtllm_n_two_is_read_per_choice() -> None:
    """Before: n > 1 was suppressed for every shape, TensorRT-LLM's per-sequence one included."""
    found = detect(trtllm(trt_spec(2, [0, 1, 1], 6), trt_spec(3, [2, 0, 0, 1], 9)))
    assert found.status == "ok" and found.choices is not None
    assert found.choices[0].num_accepted_draft_tokens == 3
    assert found.choices[1].num_accepted_draft_tokens == 3
    assert found.record is not None and found.record.num_spec_steps == 5
    assert found.record.acceptance_histogram == {0: 2, 1: 1, 2: 1, 3: 1}
    assert found.record.mean_acceptance_length == pytest.approx(1 + 6 / 5)


@pytest.mark.parametrize(
    ("specs", "why"),
    [
        ((trt_spec(2, [0, 1, 1], 6), None), "choices [1] carry no speculative_decoding"),
        ((trt_spec(2, [0, 1, 1], 6), trt_spec(1, [0, 1], 4, k=4)), "different K"),
        ((trt_spec(2, [0, 1, 1], 6), trt_spec(9, [0, 1], 4)), "choices[1].speculative_decoding"),
        ((trt_spec(2, [0, 1, 1], 6), "oops"), "not an object"),
    ],
)
def test_a_bad_choice_makes_the_request_malformed(specs: tuple[Any, ...], why: str) -> None:
    found = detect(trtllm(*specs))
    assert found.status == "malformed" and found.record is None and found.choices is None
    assert found.message is not None and why in found.message


def test_tokens_per_iteration_alone_is_no_acceptance_record() -> None:
    found = detect(trtllm(None))
    assert found.status == "absent" and found.record is None
    assert found.message is not None and "avg_decoded_tokens_per_iter (2.0)" in found.message


@pytest.mark.parametrize(
    "text",
    ["[1, 2, 3]", '[{"specDecodingStats": "x"}]', '{"specDecodingStats": {}}', "[{]",
     '[{"specDecodingStats": {"numDraftTokens": -1, "numAcceptedTokens": 0, '
     '"numRequestsWithDraftTokens": 0}}]'],
)  # fmt: skip
def test_garbage_iteration_stats_never_raise(text: str) -> None:
    parsed = parse_metrics(text)
    assert parsed is None or (parsed["drafts"] == 0 and parsed.get("skipped_iterations") == 1)


# --- units and the counts-only pooling ----------------------------------------------------------


def _request(index: int, spec: SpecDecodeAcceptanceRecord) -> RequestRecord:
    return RequestRecord(index, "c", start=0.0, end=1.0, completion_tokens=40,
                         spec=spec.model_dump(), spec_status="ok")  # fmt: skip


def vllm_record() -> SpecDecodeAcceptanceRecord:
    found = detect(
        [{"choices": [{"index": 0, "text": "x"}], "usage": dict(USAGE),
          "metrics": {"speculative_decoding": {
              "num_drafts": 5, "num_draft_tokens": 15, "num_accepted_tokens": 9,
              "acceptance_histogram": [1, 1, 1, 2]}}}]
    )  # fmt: skip
    assert found.record is not None
    return found.record


def test_draft_rates_of_different_units_are_not_pooled_but_al_is() -> None:
    """Before: a vLLM token rate and a TensorRT-LLM path rate were averaged into one figure."""
    trt = detect(trtllm(trt_spec(2, [0, 1, 1], 6))).record
    assert trt is not None and trt.draft_unit == "paths" and vllm_record().draft_unit == "tokens"
    acc = acceptance([_request(0, vllm_record()), _request(1, trt)])
    assert acc["draft_acceptance_rate"] is None
    assert acc["per_request_draft_acceptance_rate"] is None
    refusal = acc["draft_rate_refused"]
    assert refusal is not None and "paths: trtllm x1" in refusal and "tokens: vllm x1" in refusal
    assert acc["token_weighted_al"] == pytest.approx(1 + (9 + 3) / (5 + 2))
    same = acceptance([_request(0, vllm_record()), _request(1, vllm_record())])
    assert same["draft_rate_refused"] is None and same["draft_acceptance_rate"] == 0.6


def test_counts_only_requests_stay_out_of_al_and_histogram_but_count_in_the_rate() -> None:
    llama = detect(llamacpp(draft_n=15, draft_n_accepted=3)).record
    assert llama is not None
    acc = acceptance([_request(0, vllm_record()), _request(1, llama)])
    assert acc["token_weighted_al"] == pytest.approx(2.8)  # the vLLM request's alone
    assert acc["histogram"] == {"0": 1, "1": 1, "2": 1, "3": 2}
    assert acc["verify_steps"] == 5 and acc["counts_only_requests"] == 1
    assert acc["draft_acceptance_rate"] == pytest.approx((9 + 3) / (15 + 15))
    assert acc["derivable"]["llama.cpp"]["al_per_request"] == "no"
    assert acc["derivable"]["vllm"]["histogram"] == "yes"


def test_old_records_without_a_unit_are_unknown_and_not_pooled_with_known_ones() -> None:
    old = vllm_record().model_dump()
    del old["draft_unit"]
    record = RequestRecord(0, "c", start=0.0, end=1.0, spec=copy.deepcopy(old), spec_status="ok")
    acc = acceptance([record, _request(1, vllm_record())])
    assert acc["draft_units"] == {"tokens": {"vllm": 1}, "unknown": {"vllm": 1}}
    assert acc["draft_acceptance_rate"] is None


def test_llamacpp_reads_the_last_timings_of_a_stream() -> None:
    """Kills the mutation: llama.cpp's first ``timings`` read instead of the last (with
    ``timings_per_token`` every event carries the running totals; the last is the request's)."""
    early = llamacpp(draft_n=3, draft_n_accepted=1)[0]
    early.pop("usage")
    found = detect([early, *llamacpp(draft_n=18, draft_n_accepted=12)])
    assert found.status == "ok" and found.record is not None
    assert (found.record.num_draft_tokens, found.record.num_accepted_draft_tokens) == (18, 12)
