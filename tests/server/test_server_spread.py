"""The realized spread between requests as the server reports it (in process, the sim executor):
``/debug/mtp_stats``'s ``request_spread`` and ``/metrics``' ``speclens:request_acceptance_length``
agree exactly with the per-request stats of the requests served; ``/version`` states the spread
forced, or that none is; ``RealizedSpread`` keeps its memory bounded, its figures exact up to
``EXACT_REQUESTS`` requests and within a bin past them."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from speclens.acceptance import AcceptanceSpread
from speclens.acceptance.spread import LEVEL_NAMES, SPREAD_UNKNOWN, implied_mean, weighted_quantiles
from speclens.engine import Engine, EngineConfig, SpeculativeConfig, StepCost
from speclens.server import EngineRunner, ServerSettings, create_app
from speclens.server.metrics import acceptance_length_buckets
from speclens.server.settings import acceptance_settings
from speclens.server.spread import BIN_WIDTH, EXACT_REQUESTS, RealizedSpread

K, AL = 7, 3.8
QUANTILES = [1.6, 1.9, 2.2, 2.9, 3.8, 4.6, 5.4, 5.9, 6.8]
NUM_REQUESTS = 30
FAMILY = "speclens:request_acceptance_length"


def spec(with_spread: bool = True, k: int = K) -> SpeculativeConfig:
    spread = AcceptanceSpread(
        num_spec_tokens=K, quantiles=dict(zip(LEVEL_NAMES, QUANTILES, strict=True)), requests=80
    )
    if not k:
        return SpeculativeConfig()
    return SpeculativeConfig(
        method="draft_model", num_speculative_tokens=k, acceptance_length=AL, seed=2,
        acceptance_spread=spread if with_spread else None,
    )  # fmt: skip


def client(speculative: SpeculativeConfig) -> TestClient:
    engine = Engine(
        EngineConfig(
            speculative=speculative, executor="sim", kv_cache_tokens=16384, max_model_len=512,
            max_num_batched_tokens=4096, step_cost=StepCost(base=1e-4),
        )
    )  # fmt: skip
    settings = ServerSettings(
        served_model_name="m", stats_level="summary", acceptance=acceptance_settings(speculative)
    )
    return TestClient(create_app(EngineRunner(engine, realtime=False), settings))


def served(c: TestClient, n: int) -> list[dict[str, Any]]:
    """``n`` completions; each one's ``speculative_decoding_stats``."""
    out = []
    for i in range(n):
        body = {"prompt": f"request {i}", "max_tokens": 48, "ignore_eos": True}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["speculative_decoding_stats"])
    return out


@pytest.fixture(scope="module")
def spread_server() -> Iterator[tuple[TestClient, list[dict[str, Any]]]]:
    with client(spec()) as c:
        yield c, served(c, NUM_REQUESTS)


def histogram(text: str) -> dict[str, float]:
    """``speclens:request_acceptance_length``'s samples, by name and ``le``."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == FAMILY:
            assert family.type == "histogram"
            for s in family.samples:
                assert s.labels["model_name"] == "m"
                out[s.name + (f"{{{s.labels['le']}}}" if "le" in s.labels else "")] = s.value
    return out


def test_mtp_stats_states_the_realized_spread_of_the_requests_served(
    spread_server: tuple[TestClient, list[dict[str, Any]]],
) -> None:
    c, stats = spread_server
    mtp = c.get("/debug/mtp_stats").json()
    spread = mtp["request_spread"]
    als = [s["mean_acceptance_length"] for s in stats]
    steps = [s["num_spec_steps"] for s in stats]
    assert spread["requests"] == NUM_REQUESTS and spread["verify_steps"] == sum(steps)
    assert spread["mean"] == pytest.approx(mtp["average_tokens_per_forward"], abs=1e-9)
    mean = sum(a * n for a, n in zip(als, steps, strict=True)) / sum(steps)
    var = sum(n * (a - mean) ** 2 for a, n in zip(als, steps, strict=True)) / sum(steps)
    assert spread["sd_between_requests"] == pytest.approx(math.sqrt(var), abs=1e-9)
    assert spread["sd_between_requests"] > 0.5  # the requests do spread
    quantiles = [spread["quantiles"][name] for name in LEVEL_NAMES]
    exact = weighted_quantiles(als, steps)
    assert quantiles == pytest.approx(exact, abs=1e-12)  # every request kept: exact
    assert spread["exact"] is True


def test_metrics_observe_each_finished_request_s_al_once(
    spread_server: tuple[TestClient, list[dict[str, Any]]],
) -> None:
    c, stats = spread_server
    samples = histogram(c.get("/metrics").text)
    als = [s["mean_acceptance_length"] for s in stats]
    assert samples[f"{FAMILY}_count"] == NUM_REQUESTS
    assert samples[f"{FAMILY}_sum"] == pytest.approx(sum(als))
    assert samples[f"{FAMILY}_bucket{{+Inf}}"] == NUM_REQUESTS
    bounds = acceptance_length_buckets(K)
    assert bounds[0] == 1.0 and bounds[-1] == K + 1 and len(bounds) == 4 * K + 1
    for bound in bounds:
        below = sum(1 for a in als if a <= bound)
        assert samples[f"{FAMILY}_bucket{{{bound}}}"] == below


def test_version_states_the_spread_forced(
    spread_server: tuple[TestClient, list[dict[str, Any]]],
) -> None:
    acceptance = spread_server[0].get("/version").json()["acceptance"]
    spread = acceptance["spread"]
    assert spread["quantiles"] == dict(zip(LEVEL_NAMES, QUANTILES, strict=True))
    assert spread["requests"] == 80 and spread["num_spec_tokens"] == K
    fitted = [spread["fitted_quantiles"][name] for name in LEVEL_NAMES]
    assert implied_mean(fitted) == pytest.approx(AL, abs=1e-9)
    assert spread["from"] == "--spec-decode-acceptance-spread"
    assert spread["rates_derived"] is True
    assert "spread_note" not in acceptance


def test_without_a_spread_version_says_so_and_requests_are_still_counted() -> None:
    with client(spec(with_spread=False)) as c:
        served(c, 3)
        one = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "ignore_eos": True})
        assert one.json()["choices"][0]["speculative_decoding_stats"]["num_spec_steps"] == 0
        acceptance = c.get("/version").json()["acceptance"]
        assert acceptance["spread"] is None and acceptance["spread_note"] == SPREAD_UNKNOWN
        spread = c.get("/debug/mtp_stats").json()["request_spread"]
        assert spread["requests"] == 3
        assert spread["sd_between_requests"] < 0.2  # one schedule: only its own noise
        # the request with no verify step has no AL: neither view counts it
        assert histogram(c.get("/metrics").text)[f"{FAMILY}_count"] == 3


def test_without_speculation_nothing_is_counted_or_forced() -> None:
    with client(spec(k=0)) as c:
        served_plain = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
        assert served_plain.status_code == 200
        spread = c.get("/debug/mtp_stats").json()["request_spread"]
        assert spread["requests"] == 0 and spread["quantiles"] is None and spread["mean"] is None
        acceptance = c.get("/version").json()["acceptance"]
        assert acceptance["spread"] is None and "spread_note" not in acceptance
        assert histogram(c.get("/metrics").text) == {}


# ------------------------------------------------------------------------- RealizedSpread
def test_realized_spread_memory_is_bounded_and_its_figures_within_a_bin() -> None:
    rng = random.Random(4)
    realized = RealizedSpread(K)
    als = [min(8.0, max(1.0, rng.gauss(3.8, 1.2))) for _ in range(50_000)]
    steps = [rng.randint(1, 120) for _ in als]
    for a, n in zip(als, steps, strict=True):
        realized.record(a, n)
    realized.record(4.0, 0)  # no verify step: not counted
    assert len(realized._bins) <= realized.num_bins == 700
    assert len(realized._exact) == EXACT_REQUESTS
    out = realized.summary()
    assert out["requests"] == 50_000 and out["verify_steps"] == sum(steps)
    assert out["exact"] is False
    quantiles = [out["quantiles"][name] for name in LEVEL_NAMES]
    exact = weighted_quantiles(als, steps)
    assert quantiles[0] == min(als) and quantiles[-1] == max(als)
    assert quantiles == pytest.approx(exact, abs=BIN_WIDTH)
    mean = sum(a * n for a, n in zip(als, steps, strict=True)) / sum(steps)
    assert out["mean"] == pytest.approx(mean, rel=1e-12)


def test_an_empty_realized_spread_has_null_figures() -> None:
    assert RealizedSpread(3).summary() == {
        "requests": 0, "verify_steps": 0, "quantiles": None, "mean": None,
        "sd_between_requests": None, "exact": True, "bin_width": BIN_WIDTH,
    }  # fmt: skip
