"""bench's summary states the per-request AL distribution (``figures.acceptance.per_request``
and each ``al_by_category`` row's): step-weighted quantiles, a histogram over requests, and the
per-step variance of tokens per verify step split within and between requests, the between part
less its sampling noise. Every number is checked against numpy, worked out here from the
requests' histograms expanded step by step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speclens.acceptance.spread import LEVEL_NAMES, LEVELS
from speclens.runs.figures import REQUEST_BINS, acceptance
from speclens.runs.request import RequestRecord
from spreadkit import counts_only, natural_requests, record, spec

K = 3


def _steps(r: RequestRecord) -> np.ndarray:
    """A request's tokens per verify step, one entry a step."""
    assert r.spec is not None
    hist = r.spec["acceptance_histogram"]
    return np.repeat([1.0 + j for j in hist], list(hist.values()))


def _expected(records: list[RequestRecord]) -> dict[str, Any]:
    """The block worked out by hand: weights are verify steps, the quantile of level q the
    linear interpolation through each request's mid-weight (p0 and p100 the extremes)."""
    steps = [_steps(r) for r in records]
    s = np.array([len(x) for x in steps], dtype=float)
    al = np.array([x.mean() for x in steps])
    w = s / s.sum()
    order = np.argsort(al, kind="stable")
    mids = (np.cumsum(s[order]) - s[order] / 2) / s.sum()
    quantiles = np.interp(LEVELS, mids, al[order])
    quantiles[0], quantiles[-1] = al.min(), al.max()
    mean = float(np.concatenate(steps).mean())
    within = float(sum(wi * np.var(x) for wi, x in zip(w, steps, strict=True)))
    observed = float(np.sum(w * (al - mean) ** 2))
    own = np.array([np.var(x, ddof=1) for x in steps])  # every request here has 2+ steps
    noise = float(np.sum(w * (1 - w) * own / s))
    return {
        "requests": len(records), "mean": mean, "quantiles": quantiles,
        "total": float(np.var(np.concatenate(steps))), "within": within,
        "observed": observed, "noise": noise, "between": observed - noise, "al": al, "w": w,
    }  # fmt: skip


def _check(block: dict[str, Any], want: dict[str, Any]) -> None:
    assert block["requests"] == want["requests"]
    assert block["mean"] == pytest.approx(want["mean"], rel=1e-12)
    got = [block["quantiles"][name] for name in LEVEL_NAMES]
    assert got == pytest.approx(list(want["quantiles"]), rel=1e-12)
    v = block["variance"]
    assert v["total"] == pytest.approx(want["total"], rel=1e-9)
    assert v["within"] == pytest.approx(want["within"], rel=1e-9)
    assert v["between_observed"] == pytest.approx(want["observed"], rel=1e-9)
    assert v["noise"] == pytest.approx(want["noise"], rel=1e-9)
    assert v["between"] == pytest.approx(want["between"], rel=1e-9)
    assert v["between_share"] == pytest.approx(want["between"] / want["total"], rel=1e-9)


@pytest.fixture(scope="module")
def run() -> tuple[list[RequestRecord], dict[str, Any]]:
    """Two categories of requests that differ in AL and in verify steps (a request's weight),
    one llama.cpp-style counts-only request and one with no verify step: both left out."""
    records = natural_requests({"coding": 30, "math": 12}, k=K, seed=3)
    records.append(record(len(records), "coding", counts_only(40, 20)))
    records.append(record(len(records), "math", spec({}, K)))
    return records, acceptance(records)


def _stepped(records: list[RequestRecord], category: str | None = None) -> list[RequestRecord]:
    return [r for r in records if r.spec and r.spec["num_spec_steps"]
            and category in (None, r.category)]  # fmt: skip


def test_the_runs_per_request_distribution_matches_numpy(
    run: tuple[list[RequestRecord], dict[str, Any]],
) -> None:
    records, acc = run
    block = acc["per_request"]
    want = _expected(_stepped(records))
    _check(block, want)
    assert block["verify_steps"] == acc["verify_steps"]
    assert block["mean"] == pytest.approx(acc["token_weighted_al"], rel=1e-12)  # the pooled AL
    assert block["left_out"] == {"counts_only": 1, "no_verify_step": 1}
    assert block["without_histogram"] == 0
    # The data separate the measures: the request-weighted median is elsewhere.
    by_request = float(np.median(want["al"]))
    assert abs(by_request - block["quantiles"]["p50"]) > 0.01
    assert want["between"] > 0.05 and want["noise"] > 0.005  # noise matters, between is real


@pytest.mark.parametrize("category", ["coding", "math"])
def test_each_categorys_distribution_matches_numpy(
    run: tuple[list[RequestRecord], dict[str, Any]], category: str
) -> None:
    records, acc = run
    row = acc["al_by_category"][category]
    _check(row["per_request"], _expected(_stepped(records, category)))
    assert row["al"] == pytest.approx(row["per_request"]["mean"], rel=1e-12)


def test_the_histogram_over_requests_bins_each_requests_al_by_its_steps(
    run: tuple[list[RequestRecord], dict[str, Any]],
) -> None:
    records, acc = run
    hist = acc["per_request"]["histogram"]
    want = _expected(_stepped(records))
    edges = np.linspace(1, K + 1, REQUEST_BINS + 1)
    assert hist["edges"] == pytest.approx(list(edges))
    counts, _ = np.histogram(want["al"], bins=edges)
    shares, _ = np.histogram(want["al"], bins=edges, weights=want["w"])
    assert hist["requests"] == counts.tolist()
    assert hist["step_share"] == pytest.approx(list(shares), abs=1e-12)
    assert sum(hist["requests"]) == want["requests"]


def test_between_is_about_zero_when_every_request_is_alike() -> None:
    """Requests drawn at one rate differ only by chance: the observed between-request variance
    is nearly all sampling noise, and what is left of it is a small share of the whole."""
    import random

    from spreadkit import drawn_histogram

    rng = random.Random(7)
    records = [record(i, "c", spec(drawn_histogram(rng, 0.6, rng.randint(3, 30), K), K))
               for i in range(400)]  # fmt: skip
    v = acceptance(records)["per_request"]["variance"]
    assert v["between_observed"] > 0.05
    assert v["between_share"] < 0.02


def test_a_request_without_its_histogram_leaves_within_unknown() -> None:
    """Its AL is known from its counts (it counts in the quantiles); its own variance is not,
    so neither is the within part, the total, nor the noise to take from the between part."""
    records = natural_requests({"c": 20}, k=K, seed=5)
    records.append(record(20, "c", spec(None, K, steps=10, accepted=25)))
    block = acceptance(records)["per_request"]
    assert block["requests"] == 21 and block["without_histogram"] == 1
    assert block["quantiles"]["p100"] == pytest.approx(3.5)  # its AL, 1 + 25 / 10
    v = block["variance"]
    assert v["within"] is None and v["total"] is None and v["noise"] is None
    assert v["between"] is None and v["between_observed"] > 0


def test_no_request_with_a_step_states_no_distribution() -> None:
    records = [record(0, "c", counts_only(10, 5)), record(1, "c", spec({}, K))]
    assert acceptance(records)["per_request"] is None


def test_a_histogram_that_does_not_add_up_to_its_counts_is_not_read_as_its_variance() -> None:
    """Figures also run on records never read back through the validator: a histogram that
    disagrees with the request's own steps and accepted drafts says nothing of its variance."""
    records = natural_requests({"c": 20}, k=K, seed=5)
    assert records[0].spec is not None
    records[0].spec = {**records[0].spec, "acceptance_histogram": {0: 1}}
    block = acceptance(records)["per_request"]
    assert block["without_histogram"] == 1 and block["variance"]["within"] is None
