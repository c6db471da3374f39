"""``speclens lossless``: the statistics on their own, then the command against real ``speclens
serve`` processes (torch executor, the embedded dummy target and draft).

The end-to-end cases are the claim itself: speclens's speculation (natural acceptance, greedy
verification or probabilistic rejection sampling) leaves the outputs unchanged, and forced
acceptance (``--spec-decode-acceptance-length``: the synthetic sampler accepts drafts whatever
the target says) changes them, greedy and sampled, and the command says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from serverkit import ServerProcess, free_port, running_servers
from speclens.bench.lossless import (
    MIN_EXPECTED,
    LosslessConfig,
    Sample,
    Target,
    chi2_sf,
    first_divergence,
    homogeneity,
    judge,
    parse_sample,
    pooled,
)
from speclens.cli import app

# ---------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("x", [0.0, 0.01, 0.5, 1.0, 3.84, 7.0, 20.0, 80.0, 300.0])
def test_chi2_sf_matches_closed_forms(x: float) -> None:
    """df 1: erfc(sqrt(x/2)); df 2: exp(-x/2); df 4 and 6: the Poisson tail sums. x spans both
    branches (series below a + 1, continued fraction above)."""
    h = x / 2
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(h)), rel=1e-9, abs=1e-300)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-h), rel=1e-9, abs=1e-300)
    assert chi2_sf(x, 4) == pytest.approx(math.exp(-h) * (1 + h), rel=1e-9, abs=1e-300)
    assert chi2_sf(x, 6) == pytest.approx(math.exp(-h) * (1 + h + h * h / 2), rel=1e-9, abs=1e-300)


def test_chi2_sf_known_quantiles() -> None:
    """Table values: the 0.05 critical points of df 1, 5 and 30."""
    assert chi2_sf(3.841459, 1) == pytest.approx(0.05, abs=1e-6)
    assert chi2_sf(11.070498, 5) == pytest.approx(0.05, abs=1e-6)
    assert chi2_sf(43.772972, 30) == pytest.approx(0.05, abs=1e-6)


def test_pooling_leaves_every_expected_count_at_least_five() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        k = int(rng.integers(1, 40))
        probs = rng.dirichlet(np.full(k, 0.3))
        na, nb = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        a = rng.choice(k, na, p=probs).tolist()
        b = rng.choice(k, nb, p=probs).tolist()
        from collections import Counter

        cells = pooled(Counter(a), Counter(b))
        assert sum(x for _, x, _ in cells) == na and sum(y for _, _, y in cells) == nb
        if len(cells) > 1:
            n = na + nb
            assert all((x + y) * min(na, nb) / n >= MIN_EXPECTED for _, x, y in cells)


SKEWED = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.05, 0.04, 0.03, 0.02, 0.01] + [0.005] * 4)
SKEWED = SKEWED / SKEWED.sum()


def _rejections(p: np.ndarray, q: np.ndarray, alpha: float, replicates: int) -> float:
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(replicates):
        a = rng.choice(len(p), 200, p=p).tolist()
        b = rng.choice(len(q), 200, p=q).tolist()
        hits += homogeneity(a, b).p_value < alpha
    return hits / replicates


def test_false_alarm_rate_is_alpha_within_its_standard_error() -> None:
    """Same distribution on both sides (rare categories included, so pooling runs): the test
    rejects at rate alpha, within 4 standard errors of a binomial proportion."""
    alpha, replicates = 0.05, 2000
    se = math.sqrt(alpha * (1 - alpha) / replicates)
    rate = _rejections(SKEWED, SKEWED, alpha, replicates)
    assert abs(rate - alpha) <= 4 * se, rate


def test_a_moved_fifth_of_the_mass_is_found() -> None:
    """0.2 of the mass moved from the top category to the fifth. The noncentrality at 200 a side
    is 100 x (0.2**2 / 0.2 + 0.2**2 / 0.18) = 42 on about 9 df, so the power at alpha 0.01 is
    above 0.98; 0.9 leaves 300 replicates' standard error (0.008) many times over."""
    q = SKEWED.copy()
    q[0] -= 0.2
    q[4] += 0.2
    assert _rejections(SKEWED, q, 0.01, 300) > 0.9


def _samples(rng: np.random.Generator, n: int, length: int) -> list[Sample]:
    out = []
    for _ in range(n):
        ids = rng.choice(len(SKEWED), length, p=SKEWED).tolist()
        out.append(Sample(text="x" * length, token_ids=ids))
    return out


def test_bonferroni_keeps_the_family_wise_rate_at_alpha() -> None:
    """Eight tests a run (2 prompts x positions 2..5), samples from one distribution: the run is
    flagged at most alpha of the time (Bonferroni is conservative), 3 standard errors allowed.
    Without the correction the rate would be about 1 - 0.95**8 = 0.34."""
    alpha, replicates = 0.05, 250
    rng = np.random.default_rng(3)
    config = LosslessConfig(
        Target("http://a", "m"), Target("http://b", "m"), ["p", "q"],
        temperature=0.8, samples=200, max_tokens=5, alpha=alpha,
    )  # fmt: skip
    flagged = 0
    for _ in range(replicates):
        server = [_samples(rng, 200, 5) for _ in range(2)]
        reference = [_samples(rng, 200, 5) for _ in range(2)]
        report = judge(config, server, reference)
        assert report.tests == 8 and report.mode == "tokens"
        flagged += not report.passed
    se = math.sqrt(alpha * (1 - alpha) / replicates)
    assert flagged / replicates <= alpha + 3 * se


# ---------------------------------------------------------------------------- parsing and greedy


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"choices": []}',
        b'{"choices": "x"}',
        b'{"choices": [{"text": 3}]}',
        b'{"choices": [{"message": {"content": null}}]}',
    ],
)
def test_a_body_without_text_is_an_error_not_an_exception(raw: bytes) -> None:
    endpoint = "chat" if b"message" in raw else "completions"
    sample = parse_sample(raw, endpoint)
    assert sample.error is not None


def test_token_ids_are_believed_only_when_they_are_integers() -> None:
    good = parse_sample(b'{"choices": [{"text": "ab", "token_ids": [1, 2]}]}', "completions")
    assert good.token_ids == [1, 2] and good.text == "ab"
    for ids in (b'"12"', b"[1, true]", b"[1.5]", b"null"):
        raw = b'{"choices": [{"text": "ab", "token_ids": ' + ids + b"}]}"
        assert parse_sample(raw, "completions").token_ids is None


def test_first_divergence_names_the_token_and_the_character() -> None:
    a = Sample("hello world", [1, 2, 3])
    b = Sample("hello there", [1, 2, 4])
    d = first_divergence(0, a, b, "tokens")
    assert d is not None
    assert (d.index, d.server, d.reference, d.char_index) == (2, "3", "4", 6)
    assert d.server_context == "hello world" and d.reference_context == "hello there"
    assert first_divergence(0, a, Sample("hello world", [1, 2, 3]), "tokens") is None
    shorter = first_divergence(1, Sample("hel", [1]), Sample("hello", [1, 2]), "tokens")
    assert shorter is not None and (shorter.index, shorter.server) == (1, "<end>")
    chars = first_divergence(2, Sample("abcd"), Sample("abXd"), "characters")
    assert chars is not None and (chars.index, chars.server, chars.reference) == (2, "c", "X")


def test_character_mode_when_a_side_gives_no_token_ids() -> None:
    config = LosslessConfig(Target("http://a", "m"), Target("http://b", "m"), ["p"])
    report = judge(config, [[Sample("same", [1, 2])]], [[Sample("same")]])
    assert report.mode == "characters" and report.passed and report.identical == 1


# ---------------------------------------------------------------------------- end to end

SPEC = ["--method", "draft_model", "--num-speculative-tokens", "3"]
FORCED = [*SPEC, "--spec-decode-acceptance-length", "3"]
PROMPTS = ["--prompt", "The quick brown fox", "--prompt", "Once upon a time"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """No speculation (the reference), natural acceptance, forced acceptance; all torch."""
    logs = tmp_path_factory.mktemp("lossless")
    with running_servers(logs, [], SPEC, FORCED) as (reference, natural, forced):
        yield {"reference": reference, "natural": natural, "forced": forced}


def _lossless(server: ServerProcess, reference: str, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(
        app,
        ["lossless", "--url", server.url, "--reference-url", reference, "--model", "dummy",
         *PROMPTS, "--json", *args],
    )  # fmt: skip
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}


@pytest.mark.integration
@pytest.mark.slow
def test_greedy_natural_speculation_is_token_identical(servers: dict[str, ServerProcess]) -> None:
    for endpoint in ("completions", "chat"):
        code, report = _lossless(
            servers["natural"], servers["reference"].url, "--endpoint", endpoint
        )
        assert code == 0, report
        assert report["mode"] == "tokens"  # speclens serve answers return_token_ids
        assert report["passed"] and report["identical"] == 2 and report["identical_share"] == 1
        assert report["divergences"] == []


@pytest.mark.integration
@pytest.mark.slow
def test_greedy_forced_acceptance_is_flagged_at_its_first_divergent_token(
    servers: dict[str, ServerProcess],
) -> None:
    code, report = _lossless(servers["forced"], servers["reference"].url)
    assert code == 1, report
    assert not report["passed"] and report["identical"] == 0
    for d in report["divergences"]:
        # The first token comes from the prefill, before any draft: only later ones can differ.
        assert d["index"] >= 1 and d["server"] != d["reference"]


@pytest.mark.integration
@pytest.mark.slow
def test_sampled_rejection_sampling_passes_and_forced_acceptance_is_flagged(
    servers: dict[str, ServerProcess],
) -> None:
    """Temperature 0.8, 200 samples a side per prompt. The dummy target is nearly uniform over
    its 320 ids, so top-k 8 gives each position categories a chi-square test can see (the
    engine applies top-k before rejection sampling, so speculation must still be lossless)."""
    sampled = ["--temperature", "0.8", "--samples", "200", "--top-k", "8", "--alpha", "0.01"]
    code, report = _lossless(servers["natural"], servers["reference"].url, *sampled)
    assert code == 0, report
    assert report["tests"] == 8  # 2 prompts x positions 2..5, none degenerate at top-k 8
    assert report["p_value"] >= 0.01 and report["samples"] == 200
    code, report = _lossless(servers["forced"], servers["reference"].url, *sampled)
    assert code == 1, report
    assert report["p_value"] < 0.01 and report["worst"]["position"] >= 2


@pytest.mark.integration
def test_failed_requests_exit_3_and_bad_options_exit_2(servers: dict[str, ServerProcess]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    code, report = _lossless(servers["natural"], dead)
    assert code == 3, report
    assert report["failed_requests"] == 2 and not report["passed"]
    code, _ = _lossless(servers["natural"], dead, "--alpha", "1")
    assert code == 2
    result = CliRunner().invoke(
        app, ["lossless", "--url", "x", "--reference-url", "http://a", "--model", "m",
              "--samples", "1", "--temperature", "-1"],
    )  # fmt: skip
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["--url", "--temperature", "--samples"]


@pytest.mark.integration
def test_output_file_holds_the_report(servers: dict[str, ServerProcess], tmp_path: Path) -> None:
    out = tmp_path / "sub" / "lossless.json"
    code, report = _lossless(servers["natural"], servers["reference"].url, "--output", str(out))
    assert code == 0
    assert json.loads(out.read_text()) == report
