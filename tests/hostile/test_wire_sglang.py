"""Issue 14's SGLang and native-route reproductions, each as the wire really is (SGLang:
``python/sglang/srt/managers/tokenizer_manager.py`` ``_calculate_spec_decoding_metrics`` and
``_handle_batch_output``, ``entrypoints/openai/serving_completions.py``; llama.cpp b11434:
``tools/server/server-context.cpp``, the ``/completion`` stream has no ``[DONE]``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from garbage_server import GarbageServer, Reply, Request, sse

from speclens.bench.adapters import detect
from speclens.bench.client import (
    LLAMACPP_NATIVE,
    SGLANG_NATIVE,
    RequestRecord,
    Seen,
    Tally,
    finish_record,
)

MODEL_INFO = {"model_path": "m", "tokenizer_path": "m", "is_generation": True,
              "preferred_sampling_params": None, "weight_version": "default"}  # fmt: skip
SPEC = {  # 4 verify steps, K = 3: accepted 3, 0, 2, 3 (8 of 12)
    "spec_verify_ct": 4, "spec_num_correct_drafts": 8, "spec_num_proposed_drafts": 12,
    "spec_accepted_drafts": 8, "spec_proposed_drafts": 12, "spec_accept_rate": 8 / 12,
    "spec_accept_length": 13 / 4, "spec_correct_drafts_histogram": [1, 0, 1, 2],
    "spec_accept_histogram": [1, 0, 1, 2],
}  # fmt: skip


def _sglang_completions(request: Request) -> Reply:
    """SGLang's streamed /v1/completions: the stats come only when asked for, as the
    ``sglext`` chunk after the finishing one; a streamed ``return_meta_info`` is refused."""
    body = request.json()
    if body.get("return_meta_info") and body.get("stream"):
        return Reply(
            400,
            body=b'{"object":"error","message":"return_meta_info is not supported with streaming."}',
        )
    base = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    events: list[object] = [
        base | {"choices": [{"index": 0, "text": "ab", "finish_reason": None}]},
        base | {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
    ]
    if body.get("return_spec_tokens_details"):
        events.append(base | {"choices": [], "sglext": {"spec_tokens_details": SPEC}})
    events.append(base | {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 13}})
    return Reply(chunks=sse(*events))


def test_the_default_streamed_openai_route_now_reads_sglangs_stats(run_cli, tmp_path: Path) -> None:
    """Before: the client streamed without asking, SGLang sent no stats, every record was
    ``absent``. Now ``--backend auto`` finds SGLang and asks in the way SGLang allows."""
    get = {"/get_model_info": Reply(body=orjson.dumps(MODEL_INFO))}
    with GarbageServer(_sglang_completions, get=get) as server:
        code, _, err = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", 3,
            "--max-tokens", 16, "--output-dir", tmp_path,
        )  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["error"] for r in rows] == [None] * 3
    assert [r["spec_decode_status"] for r in rows] == ["ok"] * 3
    assert {r["spec_decode_acceptance"]["num_spec_steps"] for r in rows} == {4}
    assert {r["spec_decode_acceptance"]["mean_acceptance_length"] for r in rows} == {3.0}


def test_a_histogram_longer_than_k_plus_1_is_read_without_inferring_k() -> None:
    """SGLang's histogram is as long as the largest count seen + 1, padded or not; its length
    is not K + 1, so K stays unknown and the padding changes nothing."""
    meta = SPEC | {"spec_correct_drafts_histogram": [1, 0, 1, 2, 0, 0, 0, 0],
                   "spec_accept_histogram": [1, 0, 1, 2, 0, 0, 0, 0]}  # fmt: skip
    found = detect([{"text": "x", "meta_info": meta}])
    assert found.status == "ok" and found.record is not None
    assert found.record.num_spec_tokens is None
    assert found.record.acceptance_histogram == {0: 1, 2: 1, 3: 2}
    assert found.record.mean_acceptance_length == 3.0  # 1 + 8 / 4, not spec_accept_length 3.25


def test_no_fields_when_no_verify_step_ran_is_absent_not_malformed() -> None:
    """SGLang sets nothing when spec_verify_ct is 0: the request succeeds, with no record."""
    record = RequestRecord(0, "c")
    tally = Tally(record, 1, stream=False, seen=Seen(SGLANG_NATIVE))
    body = {"text": "a", "output_ids": [5], "meta_info": {
        "id": "r", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 3,
        "completion_tokens": 1, "cached_tokens": 0,
    }}  # fmt: skip
    record.end = 1.0
    tally.body(orjson.dumps(body), 0.5)
    finish_record(record, tally)
    assert record.success and record.completion_tokens == 1 and record.finish_reason == "length"
    assert record.spec_status == "absent"


def _feed(wire: Any, events: list[dict[str, Any]], done: bool) -> tuple[RequestRecord, Tally]:
    record = RequestRecord(0, "c")
    tally = Tally(record, 64, stream=True, seen=Seen(wire))
    for i, event in enumerate(events):
        tally.event(orjson.dumps(event).decode(), 0.1 * (i + 1))
    if done:
        tally.event("[DONE]", 1.0)
    record.end = 1.0
    finish_record(record, tally)
    return record, tally


def test_cumulative_native_text_is_counted_once() -> None:
    """SGLang's /generate re-sends the whole text in every chunk: a chunk that adds nothing is
    no token, and without completion_tokens each chunk with new text counts one."""
    texts = ["The", "The cat", "The cat", "The cat sat"]
    events = [{"text": t, "meta_info": {"id": "r", "finish_reason": None}} for t in texts]
    events[-1]["meta_info"]["finish_reason"] = {"type": "stop", "matched": 2}
    record, _ = _feed(SGLANG_NATIVE, events, done=True)
    assert record.success and record.finish_reason == "stop"
    assert len(record.chunk_times) == 3  # "The", " cat", " sat"
    counted = [{"text": t, "meta_info": {"completion_tokens": n}} for t, n in
               [("The", 1), ("The cat", 3), ("The cat", 3), ("The cat sat", 6)]]  # fmt: skip
    record, _ = _feed(SGLANG_NATIVE, counted, done=True)
    assert record.completion_tokens == 6 and sum(n for _, n in record.itl_runs) == 5


def test_llamacpp_native_stream_ends_without_done() -> None:
    """llama.cpp's /completion stream ends with "stop": true and a closed connection; one that
    closes before it stays a failed request, as a stream without [DONE] is today."""
    chunks = [{"content": c, "tokens": [i], "stop": False, "tokens_predicted": i + 1,
               "tokens_evaluated": 4} for i, c in enumerate("abc")]  # fmt: skip
    final = {"content": "", "tokens": [], "stop": True, "stop_type": "eos", "tokens_predicted": 3,
             "tokens_evaluated": 4, "timings": {"predicted_n": 3}}  # fmt: skip
    record, tally = _feed(LLAMACPP_NATIVE, [*chunks, final], done=False)
    assert tally.ended and record.success and record.completion_tokens == 3
    assert record.finish_reason == "stop"
    _, cut = _feed(LLAMACPP_NATIVE, chunks, done=False)
    assert not cut.ended


def test_native_chunks_of_the_wrong_type_are_unparsable() -> None:
    """The content-chunk rule holds on native wires: a non-string text or content, or a
    meta_info that is not an object, is unparsable; no content chunk fails the request."""
    record, _ = _feed(
        SGLANG_NATIVE, [{"text": 5, "meta_info": {}}, {"text": "a", "meta_info": []}], True
    )
    assert record.unparsable_events == 2
    assert record.error is not None and record.error.startswith("no parseable content chunk")
    record, _ = _feed(LLAMACPP_NATIVE, [{"content": ["a"], "stop": True}], False)
    assert record.unparsable_events == 1 and record.error is not None
