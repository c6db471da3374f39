"""``bench --dataset trace``: a Mooncake-style JSONL trace (or a run directory) sent as it was,
each request at its own arrival with its own output length, against a real ``speclens serve``
(sim executor)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import launch
from serverkit import FORCED, ServerProcess, running_server

pytestmark = pytest.mark.integration
ARRIVALS_MS = [1000, 1000, 1400, 2200, 2300]
OUTPUTS = [8, 16, 4, 12, 6]


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("trace-sim"), *FORCED, "--executor", "sim",
                        "--per-request-spec-decode-stats", "summary") as server:  # fmt: skip
        yield server


def mooncake(path: Path) -> Path:
    rows = [{"timestamp": t, "input_length": 20 + 5 * i, "output_length": n, "hash_ids": [i]}
            for i, (t, n) in enumerate(zip(ARRIVALS_MS, OUTPUTS, strict=True))]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bench(*args: str | Path) -> tuple[int, str]:
    done = launch.run([sys.executable, "-m", "speclens", "bench", *map(str, args)], timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_every_request_is_sent_at_its_arrival_with_its_length(
    sim_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    code, text = bench("--url", sim_server.url, "--model", "dummy", "--dataset", "trace",
                       "--dataset-path", mooncake(tmp_path / "t.jsonl"), "--ignore-eos",
                       "--output-dir", out)  # fmt: skip
    assert code == 0, text
    rows = sorted((json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()),
                  key=lambda r: r["index"])  # fmt: skip
    assert [r["index"] for r in rows] == list(range(len(OUTPUTS)))
    due = [(t - ARRIVALS_MS[0]) / 1000 for t in ARRIVALS_MS]
    assert [r["scheduled_s"] for r in rows] == pytest.approx(due)
    for row, when in zip(rows, due, strict=True):
        # Sent when due: never early, and late only by a loaded machine's scheduling.
        assert when <= row["start_s"] < when + 1.0, (row["start_s"], when)
    assert [r["completion_tokens"] for r in rows] == OUTPUTS
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["dataset"] == "trace" and settings["concurrency"] is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [(["--concurrency", "4"], "--dataset trace sends every request at its own arrival"),
     (["--request-rate", "2"], "--dataset trace sends every request at its own arrival")],
)  # fmt: skip
def test_a_load_option_with_a_trace_is_a_usage_error(
    tmp_path: Path, extra: list[str], expected: str
) -> None:
    code, text = bench("--url", "http://127.0.0.1:9", "--model", "dummy", "--dataset", "trace",
                       "--dataset-path", mooncake(tmp_path / "t.jsonl"), *extra)  # fmt: skip
    assert code == 2 and expected in text, text


def test_a_bad_trace_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 3, "output_length": 3}\n{"timestamp": 6}\n')
    code, text = bench("--url", "http://127.0.0.1:9", "--model", "dummy", "--dataset", "trace",
                       "--dataset-path", path)  # fmt: skip
    assert code == 1, text
    assert f"{path}: line 2: input_length: expected a token count >= 1" in text


def test_a_trace_prompt_is_varied_filler_of_its_length(tmp_path: Path) -> None:
    """Filler of the request's input length in words, not one word repeated (a prompt that
    repeats itself hands an n-gram drafter every draft)."""
    from speclens.bench.datasets import trace_prompts

    prompts = trace_prompts(mooncake(tmp_path / "t.jsonl"))
    for i, prompt in enumerate(prompts):
        words = prompt.text.split()
        assert len(words) == 20 + 5 * i
        assert len(set(words)) > len(words) // 4, prompt.text[:80]
    assert prompts[0].text != prompts[1].text  # each request its own seeded text
