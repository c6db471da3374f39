"""vLLM's newer and wider fields: the root ``metrics.speculative_decoding`` as the primary shape,
its optional ``acceptance_histogram_by_draft_length`` (variable-length drafting: draft length as a
string key, a dense accepted-count list as the value; from the issue's description of the field,
which vLLM 0.32.0's ``vllm/entrypoints/generate/base/protocol.py`` does not have yet), and the
``engine`` / ``model_name`` labels on its counters read over real HTTP."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from aiohttp import web
from standin_llamacpp import run_app

from speclens.bench.adapters import VLLMMetricsAdapter, detect
from speclens.bench.server import read_counters

# 5 verify steps: one drafted 1 token (accepted 1), three drafted 2 (accepted 0, 1, 2), one
# drafted 3 (accepted 3): 10 drafted, 7 accepted.
SPEC = {
    "num_drafts": 5,
    "num_draft_tokens": 10,
    "num_accepted_tokens": 7,
    "mean_acceptance_length": 2.4,
    "draft_acceptance_rate": 0.7,
    "acceptance_histogram": [1, 2, 1, 1],
    "acceptance_histogram_by_draft_length": {"1": [0, 1], "2": [1, 1, 1], "3": [0, 0, 0, 1]},
}


def body(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "abc", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15},
            "metrics": {"speculative_decoding": copy.deepcopy(spec)},
        }
    ]  # fmt: skip


def test_the_by_draft_length_histogram_is_read_and_checked() -> None:
    found = detect(body(SPEC))
    assert found.status == "ok" and found.adapter == "vllm-root-metrics"
    record = found.record
    assert record is not None
    assert record.acceptance_histogram_by_draft_length == {
        1: {1: 1},
        2: {0: 1, 1: 1, 2: 1},
        3: {3: 1},
    }
    assert record.num_spec_tokens == 3 and record.mean_acceptance_length == pytest.approx(2.4)


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        (
            {"1": [0, 1], "2": [1, 1, 1], "3": [0, 0, 1, 0]},
            "does not add up to acceptance_histogram",
        ),
        ({"1": [0, 0, 1], "2": [1, 2, 0], "3": [0, 0, 0, 1]}, "has a count at 2 > 1"),
        (
            {"1": [0, 1], "2": [1, 1, 1], "4": [0, 0, 0, 1]},
            "drafts 11 tokens, not num_draft_tokens 10",
        ),
        ({"01": [0, 1], "2": [1, 1, 1], "3": [0, 0, 0, 1]}, "not a count"),
        ({"1": "0,1"}, "not an array"),
    ],
)
def test_a_by_draft_length_histogram_that_contradicts_the_counts_is_refused(
    rows: dict[str, Any], why: str
) -> None:
    found = detect(body({**SPEC, "acceptance_histogram_by_draft_length": rows}))
    assert found.status == "malformed" and found.record is None
    assert found.message is not None and why in found.message


def test_the_root_shape_wins_over_the_per_choice_one() -> None:
    """The merged vLLM emits the root shape; the per-choice object is read too and must agree."""
    responses = body(SPEC)
    del responses[0]["metrics"]["speculative_decoding"]["acceptance_histogram_by_draft_length"]
    responses[0]["choices"][0]["speculative_decoding_stats"] = {
        "num_spec_tokens": 3, "num_spec_steps": 5, "num_draft_tokens": 10,
        "num_accepted_draft_tokens": 7, "mean_acceptance_length": 2.4,
        "draft_acceptance_rate": 0.7, "acceptance_histogram": {"0": 1, "1": 2, "2": 1, "3": 1},
    }  # fmt: skip
    found = detect(responses)
    assert found.status == "ok" and found.adapter == VLLMMetricsAdapter.name
    assert found.claimed_by == ["vllm-root-metrics", "vllm-per-choice-stats"]
    responses[0]["choices"][0]["speculative_decoding_stats"]["num_draft_tokens"] = 11
    responses[0]["choices"][0]["speculative_decoding_stats"]["draft_acceptance_rate"] = 7 / 11
    assert detect(responses).status == "conflict"


METRICS = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2
vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 50
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 6
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 4
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="other"} 500
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 4
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 3
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="other"} 99
"""


def test_counters_over_http_sum_the_engines_and_keep_to_the_runs_model() -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=METRICS, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    with run_app(app) as url:
        counters, why = asyncio.run(read_counters(url, model="m"))
        everything, _ = asyncio.run(read_counters(url))
    assert why is None and counters is not None
    assert (counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"]) == (5, 10, 7)
    assert everything is not None and everything["drafts"] == 55
