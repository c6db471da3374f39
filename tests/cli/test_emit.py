"""``speclens profiles resolve --emit ENGINE``: one line on stdout, notes on stderr, refusals
exit 1, usage errors exit 2, and the default output unchanged."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from speclens.acceptance.emit import ENGINES

RESOLVE = [
    "profiles", "resolve", "--model", "deepseek-v4.1-flash", "--method", "dspark",
    "--num-spec-tokens", "5", "--thinking", "on", "--category", "coding",
]  # fmt: skip
#: What the shipped registry resolves RESOLVE to (tests/cli/test_profiles_cli.py checks it).
LINES = {
    "vllm": "--speculative-config '" + json.dumps({
        "method": "dspark", "num_speculative_tokens": 5, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [1.0, 1.0, 0.51, 0.0, 0.0]}) + "'",
    "atom": "--method dspark --num-speculative-tokens 5 --spec-decode-acceptance-length 3.51",
    "sglang": "SGLANG_SIMULATE_ACC_LEN=3.51 SGLANG_SIMULATE_ACC_METHOD=match-expected",
    "trtllm": "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=2.51",
}  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
def test_emit_prints_exactly_one_line(run_cli: Any, engine: str) -> None:
    code, out, err = run_cli(*RESOLVE, "--emit", engine)
    assert code == 0, err
    assert out == LINES[engine] + "\n"
    assert all(line.startswith("note: ") for line in err.splitlines())


def test_default_output_is_unchanged_by_the_option(run_cli: Any) -> None:
    code, out, _ = run_cli(*RESOLVE)
    assert code == 0
    assert "acceptance length" in out and "3.51" in out
    assert not any(line in out for line in LINES.values())
    code, out, _ = run_cli(*RESOLVE, "--json")
    assert code == 0 and json.loads(out)["acceptance_length"] == 3.51


def test_the_vllm_line_is_one_speclens_serve_takes(run_cli: Any) -> None:
    """``speclens serve --speculative-config`` speaks vLLM's keys, so the emitted JSON must pass
    its checks and force the same schedule."""
    from speclens.cli.serve import _speculative_json

    _, out, _ = run_cli(*RESOLVE, "--emit", "vllm")
    flag, value = shlex.split(out)
    assert flag == "--speculative-config"
    spec = _speculative_json(value)
    assert spec["synthetic_acceptance_rates"] == [1.0, 1.0, 0.51, 0.0, 0.0]
    assert spec["rejection_sample_method"] == "synthetic"


def test_a_refusal_exits_1_with_one_line_and_prints_no_line(run_cli: Any) -> None:
    code, out, err = run_cli(*RESOLVE, "--per-position-rates", "0.9,0.7,0.5,0.3,0.1",
                             "--emit", "atom")  # fmt: skip
    assert code == 1 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("refused: atom: --spec-decode-acceptance-length forces only")


def test_an_engine_that_cannot_take_the_method_exits_1(run_cli: Any) -> None:
    args = ["profiles", "resolve", "--model", "x", "--method", "ngram", "-k", "3",
            "--thinking", "off", "--category", "coding", "--acceptance-length", "2.5"]  # fmt: skip
    code, out, err = run_cli(*args, "--emit", "atom")
    assert (code, out) == (1, "")
    assert err.strip() == "refused: atom: --method takes mtp, eagle3, dspark; got 'ngram'"


def test_a_stated_coverage_is_noted_on_stderr(run_cli: Any) -> None:
    code, out, err = run_cli("profiles", "resolve", "--model", "smollm2-135m-instruct",
                             "--method", "ngram", "-k", "4", "--thinking", "off",
                             "--category", "coding", "--emit", "sglang")  # fmt: skip
    assert code == 0 and out.startswith("SGLANG_SIMULATE_ACC_LEN=")
    assert "note: draft coverage 0.1799 is not forced" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--emit", "tgi"], "command line: --emit: expected vllm, atom, sglang, trtllm, got 'tgi'"),
        (["--emit", "vllm", "--json"], "command line: --emit: prints one line; do not also give --json"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_before_resolving(run_cli: Any, extra: list[str], message: str) -> None:
    code, out, err = run_cli(*RESOLVE, *extra)
    assert (code, out) == (2, "")
    assert err.strip() == message
