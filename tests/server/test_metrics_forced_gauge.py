"""``speclens:spec_decode_forced_acceptance_length`` on a real ``speclens serve``: the AL a forced
server replays, and no series at all where acceptance is the drafter's own (a 0 there would draw
a false target on a dashboard)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from serverkit import AL, FORCED, ServerProcess, families, metric, scrape

pytestmark = pytest.mark.integration

GAUGE = "speclens:spec_decode_forced_acceptance_length"
#: Speculation on, acceptance decided by the drafter (n-gram lookup): nothing forced.
NATURAL = ["--method", "ngram", "--num-speculative-tokens", "3"]


@pytest.fixture(scope="module")
def servers(serve: Any) -> tuple[ServerProcess, ...]:
    """A natural-acceptance server and a forced one, each after one request."""
    started = tuple(serve(NATURAL, FORCED))
    for server in started:
        body = {"prompt": "one two one two one two one two", "max_tokens": 16, "ignore_eos": True}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    return started


def test_nothing_forced_publishes_no_forced_acceptance_length(
    servers: tuple[ServerProcess, ...],
) -> None:
    natural = servers[0].url
    names = families(natural)
    assert "vllm:spec_decode_num_drafts" in names  # the speculating server's families are there
    assert metric(scrape(natural), "speclens:decode_steps_total") > 0
    assert GAUGE not in names
    assert not any(name == GAUGE for name, _ in scrape(natural))


def test_a_forced_server_publishes_the_al_it_replays(servers: tuple[ServerProcess, ...]) -> None:
    forced = servers[1].url
    assert families(forced)[GAUGE] == "gauge"
    assert metric(scrape(forced), GAUGE) == pytest.approx(AL)
