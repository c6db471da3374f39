"""The K schedule's pricing of the steps it compares and its tie rule: a decode step of a batch
speculating at K verifies K + 1 positions a request (as the fast path prices it), and of two Ks
with the same throughput the smaller wins (fewer drafts for the same tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speclens.sim import schedule as sc
from speclens.sim.scenario import load_scenario, roofline

EXAMPLE = Path(__file__).parents[2] / "examples" / "kimi-k3-dspark.yaml"


def _row(out_tok_s: float) -> dict[str, Any]:
    return {
        "throughput": {"output_tokens_per_s": out_tok_s},
        "latency_ms": {"tpot": {"mean": 20.0}},
    }


def _sched(table: dict[tuple[int, int, int], float]) -> dict[str, Any]:
    return sc.schedule([(c, k, n, _row(v)) for (c, k, n), v in table.items()], gpus=1)


def test_a_k_loss_is_priced_with_k_plus_one_query_tokens_a_request() -> None:
    """A step of ``b`` requests all drafting at K prices ``b + K·b`` verify slots (fast.py:
    ``seqs + k·drafting``), the target's own token included; each term's growth is read from
    those steps at both contexts."""
    scenario = load_scenario(EXAMPLE, None)
    roof = roofline(scenario, scenario.deployment.pools[0], EXAMPLE.parent)
    sched = _sched({
        (1024, 0, 64): 100, (1024, 2, 64): 150, (1024, 6, 64): 180,
        (32768, 0, 64): 100, (32768, 2, 64): 130, (32768, 6, 64): 120,
    })  # fmt: skip
    (loss,) = sc.attribute(sched, roof, fallback_batch=8)
    assert (loss["batch"], loss["from_k"], loss["to_k"]) == (64, 6, 2)

    def step(k: int, context: int) -> dict[str, float]:
        seqs = drafting = 64
        return roof.terms(seqs + k * drafting, seqs, seqs * context, drafting, k)

    for term in sc.TERMS:
        at = {c: step(6, c)[term] - step(2, c)[term] for c in (1024, 32768)}
        assert loss["growth_s"][term] == pytest.approx(at[32768] - at[1024], rel=1e-12), term


def test_a_tie_goes_to_the_smaller_k() -> None:
    """Equal throughput: no speculation over K 2 (no drafter to run), K 2 over K 4 (fewer draft
    tokens, less memory, the same output); the gain is then exact."""
    sched = _sched({
        (1024, 0, 8): 100, (1024, 2, 8): 100, (1024, 4, 8): 90,
        (1024, 0, 64): 100, (1024, 2, 64): 150, (1024, 4, 64): 150,
    })  # fmt: skip
    cells = {row["concurrency"]: row["cells"][0] for row in sched["rows"]}
    assert (cells[8]["num_spec_tokens"], cells[8]["gain"]) == (0, 0.0)
    assert (cells[64]["num_spec_tokens"], cells[64]["gain"]) == (2, pytest.approx(0.5))
    # Whatever order the points come in.
    points = [(1024, k, 64, _row(v)) for k, v in ((4, 150), (2, 150), (0, 100))]
    assert sc.schedule(points, gpus=1)["rows"][0]["cells"][0]["num_spec_tokens"] == 2
