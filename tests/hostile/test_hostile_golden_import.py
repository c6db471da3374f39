"""Hostile golden-curve files for ``profiles import-inferencex``: each is refused in one line that
names the file and the field, exit 1, nothing written, in bounded time and memory."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from speclens.acceptance.golden import read_header

HEADER = """\
# Source GitHub Actions run: {run}
# Acceptance Length (AL) reference values measured with SPEED-Bench.
# dataset: coding | temperature: 1.0 | output_len: 4096
# Measured on kimi-k3 (B300, vLLM DSpark), per num_speculative_tokens.
"""
RUN = "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/30304797750"
BODY = "kimi-k3:\n  thinking_on: {1: 1.84, 2: 2.45}\n"


def _refused(run_cli, tmp_path: Path, text: str, *extra: str) -> tuple[Path, str]:
    src = tmp_path / "kimik3_dspark.yaml"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "set.yaml"
    started = time.monotonic()
    code, stdout, err = run_cli("profiles", "import-inferencex", src, *extra, "-o", out)
    assert time.monotonic() - started < 10
    assert code == 1, err
    assert not out.exists() and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{src}: "), err
    return src, lines[0]


@pytest.mark.parametrize(
    "run",
    [
        pytest.param("https://github.com/SemiAnalysisAI/InferenceX/actions/runs/", id="no-id"),
        pytest.param("http://github.com/o/r/actions/runs/1", id="http"),
        pytest.param("https://evil.example/o/r/actions/runs/1", id="other-host"),
        pytest.param("https://github.com/o/r/actions/runs/12abc", id="not-digits"),
        pytest.param("javascript:alert(1)", id="javascript"),
        pytest.param("", id="empty"),
        pytest.param("x" * 1500, id="long"),
    ],
)
def test_a_malformed_run_url_is_named(run_cli, tmp_path: Path, run: str) -> None:
    src, line = _refused(run_cli, tmp_path, HEADER.format(run=run) + BODY)
    assert line.startswith(f"{src}: header line 1: run: expected a GitHub Actions run URL"), line
    assert len(line) < 400  # the value is quoted cut short


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param("- 1.84\n- 2.45\n", "(document)", id="a-list"),
        pytest.param("thinking_on: {1: 1.84}\n", "line 5, column 1", id="no-model-level"),
        pytest.param("kimi-k3: {1: 1.84}\n", "kimi-k3", id="no-mode-level"),
        pytest.param("kimi-k3:\n  thinking_on: [1.84, 2.45]\n", "kimi-k3.thinking_on", id="list"),
        pytest.param("kimi-k3:\n  thinking_on: {1: fast}\n", "kimi-k3.thinking_on.1", id="word"),
    ],
)
def test_a_body_that_is_not_model_mode_k_al_is_named(
    run_cli, tmp_path: Path, body: str, field: str
) -> None:
    src, line = _refused(run_cli, tmp_path, HEADER.format(run=RUN) + body)
    assert line.startswith(f"{src}: {field}: "), line
    if field.startswith("line"):
        assert line.endswith("a thinking mode where a model belongs"), line


@pytest.mark.parametrize(
    ("curve", "field", "message"),
    [
        pytest.param("{2: 3.5}", "kimi-k3.thinking_on.2", "AL 3.5 lies outside [1, 3]", id="above"),
        pytest.param("{3: 0.9}", "kimi-k3.thinking_on.3", "AL 0.9 lies outside [1, 4]", id="below"),
    ],
)
def test_an_al_outside_one_to_k_plus_one_is_named(
    run_cli, tmp_path: Path, curve: str, field: str, message: str
) -> None:
    text = HEADER.format(run=RUN) + f"kimi-k3:\n  thinking_on: {curve}\n"
    src, line = _refused(run_cli, tmp_path, text)
    assert line.startswith(f"{src}: {field}: {message}"), line


def test_ten_megabytes_of_comments_are_refused_by_size(run_cli, tmp_path: Path) -> None:
    comments = ("# " + "c" * 78 + "\n") * (10 * 1024 * 1024 // 81)
    src, line = _refused(run_cli, tmp_path, HEADER.format(run=RUN) + comments + BODY)
    assert line.startswith(f"{src}: (file): "), line


def test_a_header_just_under_the_size_limit_reads_in_bounded_time_and_memory() -> None:
    """4 MiB of comment lines: the header reader stops after its line cap."""
    text = HEADER.format(run=RUN) + ("# dataset: coding | temperature: 1.0\n" * 110_000) + BODY
    tracemalloc.start()
    started = time.monotonic()
    header, problems = read_header(text, "f.yaml")
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert problems == [] and header.run == RUN
    assert elapsed < 1.0
    assert peak < 2 * 1024 * 1024


def test_one_endless_comment_line_is_not_read_as_a_header() -> None:
    text = "# Source GitHub Actions run: " + "9" * 3_000_000 + "\n" + BODY
    started = time.monotonic()
    header, problems = read_header(text, "f.yaml")
    assert time.monotonic() - started < 1.0
    assert header.run is None and problems == []
