"""Peer test: ``speclens bench`` against a real llama.cpp ``llama-server`` (b11434).

llama-server reports speculation per request only as counts, ``timings.draft_n`` and
``timings.draft_n_accepted`` (``tools/server/server-common.cpp``, ``server_slot_stats::to_json``),
on the root of ``/completion`` and ``/v1/completions`` and on the last event of a chat stream
(``tools/server/server-task.cpp``), and only when the request drafted. Its ``/metrics`` has the
counters ``llamacpp:spec_decode_num_drafts_total`` (verify steps), ``_num_draft_tokens_total``,
``_num_accepted_tokens_total`` and ``_num_accepted_tokens_per_pos_total{position}``.

For a draft model (the target GGUF as its own draft) and for n-gram drafting (lookup 2, drafts of
up to 4, on prompts that repeat themselves), on completions,
chat and the native ``/completion``, streamed and not: the client detects llama.cpp by itself,
every request gets a counts-only record (no histogram, no steps: none is fabricated), the client's
totals of drafted and accepted tokens equal the counters' deltas exactly, and the report derives
AL from the counters (1 + Δaccepted / Δdrafts), which the per-position counters confirm.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import LLAMACPP_DRAFT_MODEL, LLAMACPP_NGRAM, Peer

#: Prompts that repeat themselves, so the n-gram drafter finds matches on every route (a request
#: that drafts nothing gets no ``draft_n`` from llama-server, hence no record).
LISTS = (
    "Continue this list: 1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3",
    "Continue this list: a b c d e f g a b c d e f g a b c d e f g a b",
    "Continue this list: Monday Tuesday Wednesday Thursday Friday Monday Tuesday Wednesday",
    "Continue this list: red green blue yellow red green blue yellow red green blue yellow red",
)
MAX_TOKENS = 48
PREFIX = "llamacpp:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def prompts(out: Path) -> Path:
    """``LISTS`` as a Spec-Bench-shaped JSONL file."""
    rows = [
        {"question_id": i, "category": "lists", "turns": [text]} for i, text in enumerate(LISTS)
    ]
    out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return out


def counters(base_url: str) -> dict[str, Any]:
    text = httpx.get(base_url + "/metrics", timeout=10.0).text
    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX) or not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(PREFIX).removesuffix("_total")
            if name == "num_accepted_tokens_per_pos":
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
            else:
                totals[name] = totals.get(name, 0.0) + sample.value
    missing = [name for name in COUNTERS if name not in totals]
    assert not missing, f"llama-server's /metrics lacks {missing}"
    return totals | {"per_position": per_position}


@pytest.fixture(scope="module", params=["draft-model", "ngram"])
def llamacpp(request: pytest.FixtureRequest, llamacpp_launcher: Any) -> Iterator[Peer]:
    spec = LLAMACPP_DRAFT_MODEL if request.param == "draft-model" else LLAMACPP_NGRAM
    with llamacpp_launcher(spec) as peer:
        yield peer


@pytest.mark.parametrize(
    ("endpoint", "stream"),
    list(itertools.product(["completions", "chat", "native"], [True, False])),
    ids=lambda v: {True: "stream", False: "no-stream"}.get(v, v) if isinstance(v, bool) else v,
)
def test_bench_reads_counts_only_and_takes_al_from_the_counters(
    llamacpp: Peer, endpoint: str, stream: bool, tmp_path: Path
) -> None:
    base_url, model, _gguf, spec = llamacpp
    dataset = prompts(tmp_path / "prompts.jsonl")
    before = counters(base_url)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "speclens", "bench", "--url", base_url, "--model", model),
            *("--endpoint", endpoint, "--stream" if stream else "--no-stream"),
            *("--dataset", "jsonl", "--dataset-path", str(dataset), "--num-requests", "4"),
            *("--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--temperature", "0"),
            *("--output-dir", str(tmp_path / "run")),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    after = counters(base_url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").open()]
    rows = [row for row in rows if not row["warmup"]]
    assert summary["settings"]["backend"] == "llamacpp", summary["settings"]
    assert len(rows) == 4 and all(row["success"] for row in rows)

    # Every request: a counts-only record from llama.cpp's timings, nothing fabricated.
    for row in rows:
        rec = row["spec_decode_acceptance"]
        assert row["spec_decode_status"] == "ok", (spec, row["spec_decode_message"])
        assert row["spec_decode_adapter"] == "llamacpp-timings"
        assert rec["num_draft_tokens"] > 0
        assert rec["acceptance_histogram"] is None and rec["num_spec_steps"] is None
        assert rec["mean_acceptance_length"] is None

    delta = {name: after[name] - before[name] for name in COUNTERS}
    drafted = sum(row["spec_decode_acceptance"]["num_draft_tokens"] for row in rows)
    accepted = sum(row["spec_decode_acceptance"]["num_accepted_draft_tokens"] for row in rows)
    assert (drafted, accepted) == (delta["num_draft_tokens"], delta["num_accepted_tokens"])
    acceptance = summary["figures"]["acceptance"]
    assert acceptance["draft_tokens"] == drafted and acceptance["accepted_tokens"] == accepted
    assert acceptance["counts_only_requests"] == 4

    check = summary["server_check"]
    assert check["available"] and check["consistent"], check
    server_al = 1.0 + delta["num_accepted_tokens"] / delta["num_drafts"]
    assert check["server_al"] == pytest.approx(server_al, abs=1e-12)
    by_position = {
        p: after["per_position"][p] - before["per_position"].get(p, 0.0)
        for p in after["per_position"]
    }
    assert sum(by_position.values()) == delta["num_accepted_tokens"]
    assert 1.0 <= server_al <= 5.0
    print(f"{spec} {endpoint} stream={stream}: drafted {drafted:.0f}, accepted {accepted:.0f}, "
          f"verify steps {delta['num_drafts']:.0f}, AL from counters {server_al:.4f}")  # fmt: skip


def test_no_request_is_lost_when_llama_server_closes_a_kept_alive_connection(
    llamacpp: Peer, tmp_path: Path
) -> None:
    """Issue 19 item 12b: llama-server closes a kept-alive connection while the next request is
    being written ("ClientOSError: Can not write request body"); that request was never
    received, so it is sent again. Enough requests at concurrency 2 to meet the race."""
    base_url, model, _gguf, _spec = llamacpp
    done = subprocess.run(
        [
            *(sys.executable, "-m", "speclens", "bench", "--url", base_url, "--model", model),
            *("--endpoint", "chat", "--stream", "--concurrency", "2", "--num-requests", "48"),
            *("--dataset", "jsonl", "--dataset-path", str(prompts(tmp_path / "prompts.jsonl"))),
            *("--max-tokens", "16", "--temperature", "0", "--output-dir", str(tmp_path / "run")),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").open()]
    errors = [row["error"] for row in rows if not row["success"]]
    assert (done.returncode, len(rows), errors) == (0, 48, []), done.stderr[-3000:]
