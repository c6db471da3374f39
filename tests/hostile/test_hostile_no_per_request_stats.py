"""A vLLM-like server that runs speculative decoding but sends no per-request stats (started
without its per-request switch): only its /metrics counters move. The verdict must lead with
that, name the engine's switch, take K from the server's counters, give the counters' AL as the
fallback, exit 4 (inconclusive), and never say the counters "agree" or blame other traffic."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from garbage_server import GarbageServer, Reply, Request, sse

K = 3
#: Per request: verify steps, and accepted drafts at positions 0..K-1 (AL = 1 + 12 / 8 = 2.5).
STEPS, ACCEPTED = 8, (6, 4, 2)
COMPLETION = {"id": "c", "object": "text_completion", "model": "m",
              "choices": [{"index": 0, "text": "abc", "finish_reason": "length"}],
              "usage": {"prompt_tokens": 4, "completion_tokens": 24, "total_tokens": 28}}  # fmt: skip


class VLLMWithoutPerRequestStats:
    """Counts each request's steps into Prometheus counters; responses carry usage only."""

    def __init__(self, served: int = 0) -> None:
        self.served = served
        self.lock = threading.Lock()
        self.get = {"/version": Reply(body=b'{"version": "0.32.0"}'), "/metrics": self.metrics()}

    def metrics(self) -> Reply:
        n = self.served
        lines = [
            "# TYPE vllm:spec_decode_num_drafts counter",
            f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {n * STEPS}',
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {n * STEPS * K}',
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} '
            f"{n * sum(ACCEPTED)}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",'
                f'model_name="m",position="{p}"}} {n * a}'
                for p, a in enumerate(ACCEPTED)
            ),
        ]
        return Reply(body=("\n".join(lines) + "\n").encode())

    def reply(self, _: Request) -> Reply:
        with self.lock:
            self.served += 1
            self.get["/metrics"] = self.metrics()
        return Reply(chunks=sse(COMPLETION))


def bench(run_cli: Any, out: Path, *extra: str) -> tuple[int, str, dict[str, Any]]:
    stub = VLLMWithoutPerRequestStats(served=5)  # traffic before the run: deltas, not totals
    with GarbageServer(stub.reply, get=stub.get) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", "6", "--warmup", "0",
            "--expect-acceptance-length", "2.5", "--output-dir", out, *extra,
        )  # fmt: skip
    return code, stdout + stderr, json.loads((out / "summary.json").read_text())


def verdict_line(text: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("verification "))
    return " ".join(line.split())


def test_no_per_request_stats_leads_with_the_engines_switch(run_cli: Any, tmp_path: Path) -> None:
    code, text, summary = bench(run_cli, tmp_path / "run")
    line = verdict_line(text)
    assert code == 4, text
    assert line.startswith(
        "verification INCONCLUSIVE: inconclusive: no request carried per-request "
        "speculative-decoding stats: start vLLM with --per-request-spec-decode-metrics summary"
    ), line
    assert "K is unknown" not in text and "send more requests" not in text
    assert "fallback: AL 2.5000 from the server's counters (metrics:vllm, 48 verify steps)" in line
    verdict = summary["verdict"]
    assert summary["engine"] == verdict["engine"] == "vllm"
    assert verdict["num_spec_tokens"] == K
    assert verdict["num_spec_tokens_source"].endswith("per-position counter on /metrics")
    assert verdict["server_acceptance_length"] == 2.5
    assert "traffic the client did not send" not in text
    check = summary["server_check"]
    assert check["compared"] is False and check["flags"] == [] and not check["consistent"]
    assert "nothing to compare" in check["note"] and "agree" not in check["note"]


def test_a_stated_k_gets_the_same_headline_not_more_requests(run_cli: Any, tmp_path: Path) -> None:
    code, text, summary = bench(run_cli, tmp_path / "run", "--num-spec-tokens", "3")
    line = verdict_line(text)
    assert code == 4, text
    assert "no request carried per-request speculative-decoding stats" in line
    assert "K 3 (from --num-spec-tokens)" in line
    assert "send more requests" not in text
    assert summary["verdict"]["num_spec_tokens_source"] == "--num-spec-tokens"


def test_zero_completed_requests_never_agree(run_cli: Any, tmp_path: Path) -> None:
    stub = VLLMWithoutPerRequestStats(served=5)  # the counters do not move: delta 0 = client 0
    out = tmp_path / "run"
    with GarbageServer(Reply(status=500, body=b"boom"), get=stub.get) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", "3", "--warmup", "0",
            "--output-dir", out,
        )  # fmt: skip
    assert code == 3, stdout + stderr
    row = next(line for line in stdout.splitlines() if "server counters" in line)
    assert "agree" not in row
    assert "no request completed: nothing to compare" in row
    assert json.loads((out / "summary.json").read_text())["server_check"]["compared"] is False
    page = (out / "report.html").read_text()
    assert "no request completed: nothing to compare" in page
    assert "server AL" not in page  # no counters row that reads as a comparison
