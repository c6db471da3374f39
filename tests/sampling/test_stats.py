"""SpecDecodeStats: step counting, merging and the GET /debug/mtp_stats object.

Where the seed's example is silent, the object follows ATOM's ``LLMEngine.get_mtp_statistics``
(ROCm/ATOM ``atom/model_engine/llm_engine.py``): ratios unrounded, 0.0 over no steps
(``average_tokens_per_forward`` included). The seed's example keeps ``distribution`` sparse.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from speclens.acceptance import AcceptanceHistogram
from speclens.sampling import SpecDecodeStats, SyntheticAcceptance, rejection_sample

MTP_STATS_KEYS = {
    "enabled",
    "total_draft_tokens",
    "total_accepted_tokens",
    "acceptance_rate",
    "average_tokens_per_forward",
    "distribution",
    "distribution_percent",
    "draft_coverage",
}

# The seed's "Confirming the run hit the target" object, verbatim.
SEED_MTP_STATS = json.loads(
    """
{
  "enabled": true,
  "total_draft_tokens": 1400000,
  "total_accepted_tokens": 553980,
  "acceptance_rate": 0.3957,
  "average_tokens_per_forward": 3.7699,
  "distribution": {"2": 46020, "3": 153980},
  "distribution_percent": {"2": 0.2301, "3": 0.7699}
}
"""
)


def test_before_any_step() -> None:
    """ATOM's empty state: every ratio over no steps is 0.0, ``average_tokens_per_forward`` too
    (``1 + accepted / steps if steps else 0.0`` in ROCm/ATOM atom/model_engine/llm_engine.py)."""
    stats = SpecDecodeStats(num_spec_tokens=7)
    assert stats.mtp_stats() == {
        "enabled": True,
        "total_draft_tokens": 0,
        "total_accepted_tokens": 0,
        "acceptance_rate": 0.0,
        "average_tokens_per_forward": 0.0,
        "distribution": {},
        "distribution_percent": {},
        "draft_coverage": 0.0,
    }
    assert stats.num_drafts == stats.num_decode_steps == 0
    assert stats.draft_coverage is None
    assert stats.accepted_per_position == [0] * 7
    assert stats.acceptance_length == 1.0
    assert stats.draft_acceptance_rate == 0.0


def test_disabled_reports_enabled_false() -> None:
    assert SpecDecodeStats(enabled=False).mtp_stats()["enabled"] is False


def test_record_counts() -> None:
    stats = SpecDecodeStats(num_spec_tokens=3)
    stats.record([3, 3, 0, 2], [2, 3, 0, 0])  # the zero-draft request-step is not a verify step
    assert stats.num_drafts == 3
    assert stats.num_draft_tokens == 8
    assert stats.num_accepted_tokens == 5
    assert stats.histogram == AcceptanceHistogram({0: 1, 2: 1, 3: 1})
    assert stats.accepted_per_position == [2, 2, 1]
    stats.record([1], [1])
    assert stats.num_drafts == 4
    assert stats.accepted_per_position == [3, 2, 1]
    assert stats.acceptance_length == pytest.approx(1 + 6 / 4)
    assert stats.draft_acceptance_rate == pytest.approx(6 / 9)


def test_record_only_zero_drafts_counts_decode_steps_only() -> None:
    stats = SpecDecodeStats(num_spec_tokens=2)
    stats.record([0, 0, 0], [0, 0, 0])
    assert stats.num_drafts == 0
    assert stats.num_decode_steps == 3
    assert stats.draft_coverage == 0.0
    assert stats.mtp_stats() == SpecDecodeStats(num_spec_tokens=2).mtp_stats()


def test_draft_coverage_counts_steps_without_drafts() -> None:
    """Coverage = verify steps / decode steps: a step that drafted nothing is a decode step."""
    stats = SpecDecodeStats(num_spec_tokens=3)
    stats.record([3, 0, 0, 2], [1, 0, 0, 2])
    stats.record([0], [0])
    assert stats.num_decode_steps == 5
    assert stats.num_drafts == 2
    assert stats.draft_coverage == 2 / 5
    out = stats.mtp_stats()
    assert out["draft_coverage"] == 2 / 5
    # AL counts verify steps only; coverage is what it leaves out.
    assert out["average_tokens_per_forward"] == 1 + 3 / 2


def test_accepted_per_position_grows_past_num_spec_tokens() -> None:
    stats = SpecDecodeStats()  # K unknown
    stats.record([4], [3])
    assert stats.accepted_per_position == [1, 1, 1]


def test_update_merges() -> None:
    a, b, both = SpecDecodeStats(2), SpecDecodeStats(4), SpecDecodeStats(2)
    steps_a = [([2, 2, 1], [1, 2, 0]), ([2, 0], [0, 0])]
    steps_b = [([4, 3], [4, 1]), ([4], [2])]
    for drafted, accepted in steps_a:
        a.record(drafted, accepted)
        both.record(drafted, accepted)
    for drafted, accepted in steps_b:
        b.record(drafted, accepted)
        both.record(drafted, accepted)
    a.update(b)
    assert a.num_drafts == both.num_drafts == 7
    assert a.num_decode_steps == both.num_decode_steps == 8
    assert a.num_draft_tokens == both.num_draft_tokens
    assert a.num_accepted_tokens == both.num_accepted_tokens
    assert a.histogram == both.histogram
    assert a.accepted_per_position == both.accepted_per_position == [5, 3, 1, 1]
    assert a.mtp_stats() == both.mtp_stats()
    # b is left as it was
    assert b.num_drafts == 3


def test_mtp_stats_keys_and_types() -> None:
    stats = SpecDecodeStats(3)
    stats.record([3, 3, 3], [0, 1, 3])
    out = stats.mtp_stats()
    assert set(out) == MTP_STATS_KEYS
    assert list(out["distribution"]) == ["0", "1", "3"]
    assert all(isinstance(key, str) for key in out["distribution_percent"])
    assert out["distribution"] == {"0": 1, "1": 1, "3": 1}
    assert out["distribution_percent"] == {"0": 1 / 3, "1": 1 / 3, "3": 1 / 3}
    assert json.loads(json.dumps(out)) == out


def test_mtp_stats_floats_unrounded() -> None:
    """ATOM reports full-precision ratios (ROCm/ATOM atom/model_engine/llm_engine.py,
    ``get_mtp_statistics``: ``total_accepted_tokens / total_draft_tokens``, ``v / total_steps``),
    so a client's delta arithmetic is not limited to 4 decimals."""
    stats = SpecDecodeStats(7)
    stats.record([7, 7, 7], [1, 2, 2])
    out = stats.mtp_stats()
    assert out["acceptance_rate"] == 5 / 21
    assert out["average_tokens_per_forward"] == 1 + 5 / 3
    assert out["distribution_percent"] == {"1": 1 / 3, "2": 2 / 3}


def test_seed_worked_example() -> None:
    """200,000 steps at K 7: 46,020 accepting 2 and 153,980 accepting 3."""
    stats = SpecDecodeStats(num_spec_tokens=7)
    for _ in range(10):  # in batches of 20,000 request-steps, as an engine would
        stats.record([7] * 4_602, [2] * 4_602)
        stats.record([7] * 15_398, [3] * 15_398)
    out = stats.mtp_stats()
    assert {key: out[key] for key in SEED_MTP_STATS} == SEED_MTP_STATS
    assert out["draft_coverage"] == 1.0  # every step drafted K
    assert stats.num_drafts == 200_000
    assert stats.accepted_per_position == [200_000, 200_000, 153_980, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("drafted", "accepted"),
    [
        ([3], [4]),  # more accepted than drafted
        ([3], [-1]),  # negative accepted
        ([2, 3], [1]),  # lengths differ
    ],
)
def test_invalid_record_raises(drafted, accepted) -> None:
    stats = SpecDecodeStats(3)
    with pytest.raises(ValueError):
        stats.record(drafted, accepted)


def test_invalid_record_with_no_drafts_raises() -> None:
    """Accepting drafts that were never proposed is as invalid with 0 drafts as with 3."""
    stats = SpecDecodeStats(3)
    with pytest.raises(ValueError):
        stats.record([0], [1])


def test_negative_draft_count_raises() -> None:
    stats = SpecDecodeStats(3)
    with pytest.raises(ValueError):
        stats.record([-1], [0])


def test_end_to_end_with_synthetic_sampler() -> None:
    k, batch, steps = 7, 20_000, 5  # 100,000 request-steps
    synthetic = SyntheticAcceptance.from_length(3.78, k, seed=31)
    gen = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, 100, (batch, k), generator=gen)
    argmax = torch.randint(0, 100, (batch, k + 1), generator=gen)
    num_draft = torch.full((batch,), k)
    bonus = torch.full((batch,), 7)
    stats = SpecDecodeStats(num_spec_tokens=k)
    for _ in range(steps):
        out = rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )
        stats.record(num_draft.tolist(), out.num_accepted.tolist())
    result = stats.mtp_stats()
    assert set(result["distribution"]) == {"2", "3"}
    assert sum(result["distribution"].values()) == batch * steps
    assert result["total_draft_tokens"] == k * batch * steps
    # Realized AL vs 3.78: Var(accepted) = 0.22 * 0.78, SE = sqrt(0.1716 / 100,000) = 0.00131;
    # 4 SE = 0.0052.
    se = math.sqrt(0.22 * 0.78 / (batch * steps))
    assert abs(result["average_tokens_per_forward"] - 3.78) < 4 * se
    assert abs(stats.acceptance_length - 3.78) < 4 * se
