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
    DEFAULT_MIN_EFFECT,
    MIN_EXPECTED,
    MIN_TESTABLE,
    LosslessConfig,
    Sample,
    Target,
    chi2_sf,
    compared_positions,
    detectable_tv,
    first_divergence,
    homogeneity,
    judge,
    noncentrality_for_power,
    parse_sample,
    pooled,
    position_units,
    samples_for_effect,
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
    return _drawn(rng, SKEWED, n, length)


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
        flagged += report.verdict == "flagged"
    se = math.sqrt(alpha * (1 - alpha) / replicates)
    assert flagged / replicates <= alpha + 3 * se


def _config(samples: int, **kw: Any) -> LosslessConfig:
    return LosslessConfig(
        Target("http://a", "m"), Target("http://b", "m"), ["p", "q"],
        temperature=1.0, samples=samples, max_tokens=5, **kw,
    )  # fmt: skip


def _drawn(rng: np.random.Generator, probs: np.ndarray, n: int, length: int = 5) -> list[Sample]:
    """n samples of ``length`` tokens, drawn in one call (a call per sample was most of the
    module's time)."""
    ids = rng.choice(len(probs), size=(n, length), p=probs).tolist()
    return [Sample("x" * length, row) for row in ids]


def test_judge_flags_samples_from_different_distributions() -> None:
    """Mutation killed: ``judge`` returning passed (or verdict "pass") whatever the samples."""
    rng = np.random.default_rng(11)
    moved = SKEWED.copy()
    moved[0] -= 0.2
    moved[4] += 0.2
    server = [_drawn(rng, moved, 200) for _ in range(2)]
    reference = [_drawn(rng, SKEWED, 200) for _ in range(2)]
    report = judge(_config(200), server, reference)
    assert report.tests == 8
    assert report.verdict == "flagged" and not report.passed
    assert report.p_value is not None and report.p_value < 0.01
    assert "8 tests over 2 prompts x 200 samples a side" in report.reason


@pytest.mark.parametrize("moved", [0.0, 0.06])
def test_bonferroni_p_is_exactly_tests_times_the_smallest_p(moved: float) -> None:
    """Mutation killed: Bonferroni's factor multiplied (by 1,000) or divided. The adjusted p is
    min(1, tests x min p), recomputed here from each column's own test: equal, not just below.
    With ``moved`` 0.06 the product is below 1 (a larger factor would change it); with 0 the
    product saturates at exactly 1."""
    rng = np.random.default_rng(5)
    q = SKEWED.copy()
    q[0] -= moved
    q[3] += moved
    server = [_drawn(rng, q, 200) for _ in range(2)]
    reference = [_drawn(rng, SKEWED, 200) for _ in range(2)]
    config = _config(200)
    report = judge(config, server, reference)
    positions = compared_positions(config, "tokens")
    ps = [
        homogeneity(a, b).p_value
        for mine, theirs in zip(server, reference, strict=True)
        for a, b in zip(
            position_units(mine, "tokens", positions),
            position_units(theirs, "tokens", positions),
            strict=True,
        )
    ]
    assert report.tests == len(ps) == 8
    assert report.min_p_value == min(ps)
    assert report.p_value == min(1.0, len(ps) * min(ps))
    if moved:
        assert 0 < report.p_value < 0.5  # below 1, so any other factor shows
    else:
        assert len(ps) * min(ps) > 1 and report.p_value == 1.0


def test_no_test_is_inconclusive_and_says_the_units_were_too_rare() -> None:
    """A flat distribution (every sample its own token): nothing reaches an expected count of
    5, so nothing is tested. Before: PASS with "every compared position held one category"."""
    rng = np.random.default_rng(2)
    flat = np.full(300, 1 / 300)
    server = [_drawn(rng, flat, 20) for _ in range(2)]
    reference = [_drawn(rng, flat, 20) for _ in range(2)]
    report = judge(_config(20), server, reference)
    assert report.tests == 0 and report.verdict == "inconclusive" and not report.passed
    assert report.untested_pooled == 8 and report.untested_single == 0
    assert "no test ran: of 8 prompt positions" in report.reason
    assert "too rare" in report.reason and "one unit, the same" not in report.reason


def test_one_unit_on_both_sides_is_inconclusive_and_says_so() -> None:
    same = [[Sample("aaaaa", [7] * 5) for _ in range(20)] for _ in range(2)]
    report = judge(_config(20), same, same)
    assert report.tests == 0 and report.verdict == "inconclusive"
    assert report.untested_single == 8 and "one unit, the same on both sides" in report.reason


def test_below_ten_samples_no_test_can_run_and_the_reason_says_so() -> None:
    """5 samples a side: two categories of expected count 5 need 10 a side, so no position can
    ever be tested, whatever the samples hold (here they differ everywhere)."""
    hello = [[Sample("hello") for _ in range(5)] for _ in range(2)]
    other = [[Sample(f"{i}bcde") for i in range(5)] for _ in range(2)]
    report = judge(_config(5), hello, other)
    assert report.mode == "characters" and report.tests == 0
    assert report.verdict == "inconclusive"
    assert f"at least {MIN_TESTABLE} samples a side" in report.reason


def test_too_few_samples_for_the_min_effect_is_inconclusive() -> None:
    """Tests ran and found nothing, but at 30 samples a side they cannot see the default
    total variation (0.4): inconclusive, naming the samples that would."""
    rng = np.random.default_rng(4)
    two = np.array([0.5, 0.5])
    server = [_drawn(rng, two, 30) for _ in range(2)]
    reference = [_drawn(rng, two, 30) for _ in range(2)]
    report = judge(_config(30), server, reference)
    assert report.tests == 8 and report.p_value is not None and report.p_value >= 0.01
    assert report.detectable_tv is not None and report.detectable_tv > DEFAULT_MIN_EFFECT
    assert report.verdict == "inconclusive"
    needed = samples_for_effect(DEFAULT_MIN_EFFECT, 0.01 / 8, 1)
    assert report.samples_needed == needed and f"needs --samples {needed}" in report.reason
    loose = judge(_config(30, min_effect=0.6), server, reference)
    assert loose.verdict == "pass" and loose.detectable_tv == report.detectable_tv


def test_the_default_run_is_never_inconclusive_for_power_alone() -> None:
    """200 samples a side leave at most 40 categories after pooling (df 39); at 16 tests (the
    default 4 prompts x positions 2..5) the weakest test still sees the default effect."""
    assert 2 * 200 // MIN_TESTABLE == 40
    assert detectable_tv(200, 200, 0.01 / 16, 39) <= DEFAULT_MIN_EFFECT


def test_noncentrality_at_one_df_is_the_normal_closed_form() -> None:
    """df 1: the chi-square test is a two-sided z test, so λ = (z(1 - α/2) + z(power))²."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    for alpha in (0.05, 0.01, 0.001):
        expected = (z(1 - alpha / 2) + z(0.8)) ** 2
        assert noncentrality_for_power(alpha, 1) == pytest.approx(expected, rel=1e-3)
    assert noncentrality_for_power(0.01, 8) > noncentrality_for_power(0.01, 1)


def test_detectable_tv_is_detected_80_percent_of_the_time() -> None:
    """Two categories at 0.5 ± δ/2 (total variation δ, the least favourable shape), at the
    samples ``samples_for_effect`` asks for: the test rejects at 0.8, within 4 standard errors."""
    tv, alpha, replicates = 0.2, 0.01, 600
    n = samples_for_effect(tv, alpha, 1)
    assert detectable_tv(n, n, alpha, 1) <= tv < detectable_tv(n - 1, n - 1, alpha, 1)
    rng = np.random.default_rng(9)
    p, q = np.array([0.5 + tv / 2, 0.5 - tv / 2]), np.array([0.5 - tv / 2, 0.5 + tv / 2])
    hits = sum(
        homogeneity(rng.choice(2, n, p=p).tolist(), rng.choice(2, n, p=q).tolist()).p_value < alpha
        for _ in range(replicates)
    )
    se = math.sqrt(0.8 * 0.2 / replicates)
    assert abs(hits / replicates - 0.8) <= 4 * se


def test_chosen_positions_are_the_only_ones_tested() -> None:
    config = _config(200, positions=[2, 4])
    assert compared_positions(config, "tokens") == [1, 3]
    assert compared_positions(config, "characters") == [4, 5, 6, 7, 12, 13, 14, 15]
    rng = np.random.default_rng(3)
    server = [_drawn(rng, SKEWED, 200) for _ in range(2)]
    reference = [_drawn(rng, SKEWED, 200) for _ in range(2)]
    report = judge(config, server, reference)
    assert report.positions == [2, 4] and report.tests == 4
    assert "positions 2,4 (2 per prompt)" in report.compared


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


@pytest.mark.integration
def test_a_flat_distribution_without_top_k_is_inconclusive_not_pass(
    servers: dict[str, ServerProcess],
) -> None:
    """The dummy target is nearly uniform over 320 ids: at temperature 1 without --top-k every
    token pools into one category, df is 0 and no test runs. Before: PASS, exit 0."""
    code, report = _lossless(
        servers["natural"], servers["reference"].url,
        "--temperature", "1", "--samples", "20", "--max-tokens", "3",
    )  # fmt: skip
    assert code == 4, report
    assert report["verdict"] == "inconclusive" and not report["passed"]
    assert report["tests"] == 0 and report["untested_pooled"] == 4
    assert "too rare" in report["reason"]
