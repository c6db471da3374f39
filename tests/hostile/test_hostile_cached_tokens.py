"""``cached_tokens``: the prompt tokens a server says it took from its prefix cache (OpenAI's
``usage.prompt_tokens_details.cached_tokens``, as vLLM, SGLang and llama.cpp's OpenAI routes send
it). A calibration and a replay price a prefill by the tokens it computed, so a wrong count must
not get in: one that is not a count, or more than the prompt, is noted on the request and
dropped; a records.jsonl row that states one is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speclens.bench.client import RequestRecord, Tally, finish_record
from speclens.runs.compare_inputs import read_run
from speclens.runs.report import RecordStream, record_row
from speclens.runs.rundir import InputError
from speclens.sim import run_output


def finished(usage: dict[str, Any]) -> RequestRecord:
    body = {"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}], "usage": usage}
    record = RequestRecord(0, "x")
    tally = Tally(record, 16, stream=False)
    tally.body(json.dumps(body).encode(), 0.5)
    record.end = 1.0
    finish_record(record, tally)
    return record


def test_the_cached_prompt_tokens_are_kept() -> None:
    usage = {
        "prompt_tokens": 57,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 56},
    }
    record = finished(usage)
    assert record.success and record.cached_tokens == 56 and not record.anomalies
    assert record_row(record)["cached_tokens"] == 56
    assert finished({"prompt_tokens": 5, "completion_tokens": 2}).cached_tokens is None


@pytest.mark.parametrize(
    ("cached", "why"),
    [
        (58, "beyond the bound 57"),
        (-1, "negative"),
        ("56", "not an integer"),
        (True, "not an integer"),
    ],
)
def test_a_wrong_cached_count_is_noted_and_dropped(cached: object, why: str) -> None:
    usage = {"prompt_tokens": 57, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
    record = finished(usage)
    assert record.success and record.cached_tokens is None
    (note,) = record.anomalies
    assert note.startswith("usage.prompt_tokens_details.cached_tokens: ") and why in note, note


def test_a_row_with_more_cached_tokens_than_its_prompt_is_refused(tmp_path: Path) -> None:
    record = finished({"prompt_tokens": 10, "completion_tokens": 2})
    settings = {"model": "m", "max_tokens": 2, "ignore_eos": True, "temperature": 0.0}
    summary = run_output.summary([record], 1.0, settings, None, {})
    run_output.write_run(RecordStream(tmp_path), summary, [record])
    read_run(tmp_path)  # as written, it reads
    row = {**json.loads((tmp_path / "records.jsonl").read_text()), "cached_tokens": 11}
    (tmp_path / "records.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(InputError) as caught:
        read_run(tmp_path)
    text = "\n".join(caught.value.lines)
    assert (
        "records.jsonl: line 1: cached_tokens: expected null or a count at most "
        "prompt_tokens (10), got 11"
    ) in text, text
