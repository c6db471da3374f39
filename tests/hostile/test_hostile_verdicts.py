"""Verdicts need evidence: a lossless check that ran no test, or could not have seen the effect
it was asked about, is "inconclusive" (exit 4), never PASS; its options are checked first."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest
from garbage_server import GarbageServer, Reply, Request
from typer.testing import CliRunner

from speclens.cli import app


def _completion(text: str) -> Reply:
    body = {"choices": [{"index": 0, "text": text, "finish_reason": "length"}]}
    return Reply(body=orjson.dumps(body), headers={"Content-Type": "application/json"})


def _seeded(request: Request) -> Reply:
    """A different text for every seed: what a real sampler looks like from outside."""
    rng = random.Random(request.json()["seed"])
    return _completion("".join(rng.choice("abcdefgh") for _ in range(5)))


def _lossless(*args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["lossless", "--model", "m", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    out = result.stdout.strip()
    data = json.loads(out) if out.startswith("{") else {}
    return result.exit_code, data, result.output


def test_hello_against_a_sampler_at_5_samples_is_inconclusive_with_a_true_reason() -> None:
    """A server that always answers "hello", against one whose text changes with every seed,
    at --samples 5. Before: PASS, "every compared position held one category on both sides",
    which is false (the sides differ everywhere); 5 samples can never make a test."""
    with GarbageServer(_completion("hello")) as hello, GarbageServer(_seeded) as sampler:
        code, report, _ = _lossless(
            "--url", hello.url, "--reference-url", sampler.url, "--prompt", "hi",
            "--temperature", "1", "--samples", "5", "--max-tokens", "2", "--json",
        )  # fmt: skip
        assert code == 4, report
        assert report["verdict"] == "inconclusive" and report["tests"] == 0
        assert "at least 10 samples a side" in report["reason"]
        code, _, output = _lossless(
            "--url", hello.url, "--reference-url", sampler.url, "--prompt", "hi",
            "--temperature", "1", "--samples", "5", "--max-tokens", "2",
        )  # fmt: skip
        assert code == 4
        assert "speclens lossless: INCONCLUSIVE: no test can run on 5 samples" in output
        assert "held one category" not in output


def test_hello_against_a_sampler_with_enough_samples_is_flagged() -> None:
    """The control: with 40 samples a side the same pair is tested and flagged (exit 1)."""
    with GarbageServer(_completion("hello")) as hello, GarbageServer(_seeded) as sampler:
        code, report, _ = _lossless(
            "--url", hello.url, "--reference-url", sampler.url, "--prompt", "hi",
            "--temperature", "1", "--samples", "40", "--max-tokens", "2", "--json",
        )  # fmt: skip
    assert code == 1, report
    assert report["verdict"] == "flagged" and report["tests"] > 0


def test_min_effect_sizes_the_samples() -> None:
    """--min-effect without --samples: the samples every planned test needs (here both sides are
    unreachable, so the run ends with exit 3, but the report holds the sized samples)."""
    from speclens.cli.lossless import sized_samples

    expected = sized_samples(0.5, 0.01, 4, None)
    assert expected == sized_samples(0.5, 0.01, 4, None) > 10
    code, report, _ = _lossless(
        "--url", "http://127.0.0.1:9", "--reference-url", "http://127.0.0.1:9",
        "--prompt", "hi", "--temperature", "1", "--min-effect", "0.5", "--json",
    )  # fmt: skip
    assert code == 3
    assert report["samples"] == expected and report["min_effect"] == 0.5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--positions", "x"], "--positions: expected token positions like 2,3 or 2-5"),
        (["--positions", "0,2"], "--positions: expected token positions"),
        (["--positions", "5-2"], "--positions: expected token positions"),
        (["--positions", "1-99999999999"], "--positions: expected token positions"),
        (
            ["--positions", "2,9", "--max-tokens", "5"],
            "--positions: position 9 is beyond --max-tokens 5",
        ),
        (["--min-effect", "0"], "--min-effect: expected"),
        (["--min-effect", "1.5"], "--min-effect: expected"),
        (["--min-effect", "0.001"], "--min-effect: 0.001 needs"),
    ],
)
def test_bad_positions_and_min_effect_exit_2(args: list[str], message: str) -> None:
    code, _, output = _lossless(
        "--url", "http://127.0.0.1:9", "--reference-url", "http://127.0.0.1:9",
        "--prompt", "hi", "--temperature", "1", *args,
    )  # fmt: skip
    assert code == 2, output
    assert f"command line: {message}" in output


def test_positions_are_for_a_sampled_test_only() -> None:
    code, _, output = _lossless(
        "--url", "http://127.0.0.1:9", "--reference-url", "http://127.0.0.1:9",
        "--prompt", "hi", "--positions", "2",
    )  # fmt: skip
    assert code == 2
    assert "command line: --positions: expected only with a sampled test" in output


def test_lossless_follows_no_redirect_and_names_it() -> None:
    """lossless sends its prompts as bench does: a 307 to another origin is a failed request
    naming the Location (exit 3, no verdict), and the other origin receives nothing. Before:
    aiohttp followed it and the other server's answers were judged."""
    with GarbageServer(_seeded) as other:
        moved = Reply(307, headers={"Location": other.url + "/v1/completions"}, body=b"")
        with GarbageServer(moved) as server, GarbageServer(_seeded) as reference:
            code, _, output = _lossless(
                "--url", server.url, "--reference-url", reference.url, "--prompt", "hi",
                "--temperature", "1", "--samples", "20", "--max-tokens", "2", "--json",
            )  # fmt: skip
        reached = list(other.requests)
    assert reached == []
    assert code == 3, output
    assert f"a redirect to '{other.url}/v1/completions', not followed" in output
