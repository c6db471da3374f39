"""The numbers of compare's headline sentences, each against a computation written out here
(never compare's own): the deltas at matched interactivity, read off each input's Pareto curve
between points at a weight that is not a half; their intervals from two rounds a point (Student
t, Welch-Satterthwaite degrees of freedom, not a normal quantile); throughput per GPU with
--gpus above 1; the ratio at matched concurrency; and the AL difference of natural runs with
its interval (the two SEs combined in quadrature).

The runs are written by hand so every figure is known: a round of ``N`` requests of 64 tokens
at TPOT 1 / x has x tokens/s per user, and over a duration of 64 N / y it has y output tokens/s.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from scipy import stats

from comparekit import row, timed_row, write_rows
from speclens.runs import compare as cmp
from speclens.runs.compare_inputs import read_inputs

N = 4
Z = 1.959963984540054  # the normal's 97.5% quantile

#: Per input, per concurrency: tokens/s per user, and each of two rounds' output tokens/s.
A = {1: (100.0, (50.0, 54.0)), 4: (40.0, (150.0, 160.0))}
B = {1: (85.0, (60.0, 66.0)), 4: (25.0, (200.0, 190.0))}


def _round(path: Path, x: float, y: float) -> Path:
    tpot = 1 / x
    rows = [timed_row(i, latency_s=0.02 + 63 * tpot, ttft_s=0.02, tpot_s=tpot,
                      itl_runs_s=[[tpot, 63]]) for i in range(N)]  # fmt: skip
    return write_rows(path, rows, duration_s=64 * N / y)


def _sweep(path: Path, points: dict[int, tuple[float, tuple[float, float]]]) -> Path:
    entries = []
    for c, (x, ys) in points.items():
        for r, y in enumerate(ys):
            pid = f"c{c}-r{r}"
            _round(path / "points" / pid, x, y)
            entries.append({"id": pid, "engine": None, "round": r, "dir": f"points/{pid}",
                            "status": "ok", "exit_code": 0, "error": None,
                            "settings": {"concurrency": c, "request_rate": None,
                                         "num_speculative_tokens": None,
                                         "acceptance_length": None}})  # fmt: skip
    sweep = {"schema": "speclens.sweep/1", "kind": "load", "rounds": 2,
             "axes": {"concurrency": sorted(points)}, "points": entries, "stats": []}  # fmt: skip
    (path / "sweep.json").write_bytes(orjson.dumps(sweep))
    return path


def _pair(tmp_path: Path, gpus: list[int]) -> dict[str, Any]:
    paths = [_sweep(tmp_path / "a", A), _sweep(tmp_path / "b", B)]
    result = cmp.compare(read_inputs(paths, ["A", "B"], gpus), metric="output")
    pair: dict[str, Any] = result["pairs"][0]
    assert pair["comparable"], pair["label"]
    return pair


# --- the computation, written out ------------------------------------------------------------------


def _point(ys: tuple[float, float], gpus: int) -> tuple[float, float, float]:
    """(mean, SE, df) of two rounds: the SE of a mean of two is |y1 - y2| / 2, with 1 df."""
    return (ys[0] + ys[1]) / 2 / gpus, abs(ys[0] - ys[1]) / 2 / gpus, 1.0


def _at(points: dict[int, tuple[float, tuple[float, float]]], x: float, gpus: int) -> tuple[float, float, float]:  # fmt: skip
    """The curve (two points) at x: (1 - w) left + w right, w = (x - x_left) / (x_right -
    x_left); its variance (1 - w)^2 SE_left^2 + w^2 SE_right^2, df by Welch-Satterthwaite."""
    (xl, yl), (xr, yr) = sorted(points.values())
    w = (x - xl) / (xr - xl)
    (ml, sl, dl), (mr, sr, dr) = _point(yl, gpus), _point(yr, gpus)
    vl, vr = (1 - w) ** 2 * sl**2, w**2 * sr**2
    df = (vl + vr) ** 2 / (vl**2 / dl + vr**2 / dr)
    return (1 - w) * ml + w * mr, math.sqrt(vl + vr), df


def _ratio(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:  # fmt: skip
    """b / a and its 95% interval: log scale, relative variances summed, t at Welch's df."""
    va, vb = (a[1] / a[0]) ** 2, (b[1] / b[0]) ** 2
    df = (va + vb) ** 2 / (va**2 / a[2] + vb**2 / b[2])
    spread = float(stats.t.ppf(0.975, df)) * math.sqrt(va + vb)
    r = b[0] / a[0]
    return r, r * math.exp(-spread), r * math.exp(spread)


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [[1, 1], [4, 1]])
def test_the_deltas_at_matched_interactivity(tmp_path: Path, gpus: list[int]) -> None:
    """A's curve runs from 40 to 100 tok/s/user, B's from 25 to 85: compared at 40 (A's point,
    B at weight 0.25 between its two) and at 85 (B's point, A at weight 0.75). With 4 GPUs
    behind A its throughput and its SE per GPU are a quarter."""
    rows = _pair(tmp_path, gpus)["deltas"]["matched_interactivity"]
    assert [m["tokens_per_s_per_user"] for m in rows] == pytest.approx([40.0, 85.0], rel=1e-9)
    for m, x in zip(rows, (40.0, 85.0), strict=True):
        a, b = _at(A, x, gpus[0]), _at(B, x, gpus[1])
        r, low, high = _ratio(a, b)
        assert (m["a_tok_s_gpu"], m["b_tok_s_gpu"]) == pytest.approx((a[0], b[0]), rel=1e-9)
        assert m["delta_pct"] == pytest.approx((r - 1) * 100, rel=1e-9)
        assert m["low_pct"] == pytest.approx((low - 1) * 100, rel=1e-9)
        assert m["high_pct"] == pytest.approx((high - 1) * 100, rel=1e-9)
        assert m["sentence"] == (f"at {x:.0f} tok/s/user, B delivers {(r - 1) * 100:+.0f}% "
                                 f"output tok/s/GPU (CI {(low - 1) * 100:+.0f}% to "
                                 f"{(high - 1) * 100:+.0f}%)")  # fmt: skip
    # at 40, B is read at weight 0.25: 0.75 * 195 + 0.25 * 63 (per GPU, B has one)
    assert rows[0]["b_tok_s_gpu"] == pytest.approx(162.0, rel=1e-9)
    assert rows[1]["a_tok_s_gpu"] == pytest.approx((0.25 * 155 + 0.75 * 52) / gpus[0], rel=1e-9)


def test_two_round_intervals_are_t_wide_not_normal(tmp_path: Path) -> None:
    """Each point has 2 rounds (1 df): the ratio's interval uses t at a Welch df near 1 to 2,
    more than twice as wide on the log scale as a normal quantile would make it."""
    m = _pair(tmp_path, [1, 1])["deltas"]["matched_interactivity"][0]
    a, b = _at(A, 40.0, 1), _at(B, 40.0, 1)
    va, vb = (a[1] / a[0]) ** 2, (b[1] / b[0]) ** 2
    df = (va + vb) ** 2 / (va**2 / a[2] + vb**2 / b[2])
    assert 1 <= df <= 2
    width = math.log((100 + m["high_pct"]) / (100 + m["low_pct"]))
    assert width == pytest.approx(2 * float(stats.t.ppf(0.975, df)) * math.sqrt(va + vb), rel=1e-9)
    assert width > 2 * (2 * Z * math.sqrt(va + vb))


def test_the_ratio_at_matched_concurrency(tmp_path: Path) -> None:
    deltas = _pair(tmp_path, [1, 1])["deltas"]["matched_concurrency"]
    for c in (1, 4):
        found = next(d for d in deltas if d["concurrency"] == c
                     and d["figure"] == "output_tokens_per_s")  # fmt: skip
        expected = _ratio(_point(A[c][1], 1), _point(B[c][1], 1))
        assert (found["ratio"], found["ratio_low"], found["ratio_high"]) == pytest.approx(
            expected, rel=1e-9
        )
        assert (found["a"]["method"], found["a"]["n"]) == ("t", 2)


# --- the AL difference of natural runs --------------------------------------------------------------

#: Per request, its histogram {accepted drafts: verify steps} (K 3).
A_STEPS = [{3: 10}, {0: 10}, {3: 5, 0: 5}, {1: 10}, {2: 10}, {3: 8, 0: 2}]
B_STEPS = [{3: 10}, {3: 10}, {2: 10}, {3: 6, 1: 4}, {1: 10}, {2: 5, 3: 5}]


def _natural(path: Path, histograms: list[dict[int, int]]) -> Path:
    rows = [row(i, prompt_tokens=300, completion_tokens=64, tpot_s=0.01, histogram=h, k=3)
            for i, h in enumerate(histograms)]  # fmt: skip
    path.mkdir(parents=True)
    write_rows(path, [], duration_s=1.0)
    (path / "records.jsonl").write_bytes(
        b"".join(orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS) + b"\n" for r in rows)
    )
    return path


def _al(histograms: list[dict[int, int]]) -> tuple[float, float]:
    """The pooled AL 1 + sum(a) / sum(s) and its ratio-estimator SE:
    sqrt(sum((a_i - r s_i)^2) / (n (n - 1))) / mean(s)."""
    accepted = [sum(j * n for j, n in h.items()) for h in histograms]
    steps = [sum(h.values()) for h in histograms]
    n, r = len(steps), sum(accepted) / sum(steps)
    residual = sum((a - r * s) ** 2 for a, s in zip(accepted, steps, strict=True))
    return 1 + r, math.sqrt(residual / (n * (n - 1))) / (sum(steps) / n)


def test_the_al_difference_and_its_interval(tmp_path: Path) -> None:
    a, b = _natural(tmp_path / "a", A_STEPS), _natural(tmp_path / "b", B_STEPS)
    result = cmp.compare(read_inputs([a, b], ["A", "B"], [1, 1]), metric="output")
    check = next(c for c in result["pairs"][0]["checks"] if c["name"] == "acceptance")
    assert check["ok"] and check["detail"].startswith("natural acceptance: A AL "), check
    (al_a, se_a), (al_b, se_b) = _al(A_STEPS), _al(B_STEPS)
    number = r"([+-]?\d+\.\d{3})"
    shown = re.fullmatch(
        rf"natural acceptance: A AL {number} \(95% CI {number} to {number}, 6 requests\); "
        rf"B AL {number} \(95% CI {number} to {number}, 6 requests\); "
        rf"B - A {number} \(95% CI {number} to {number}\)",
        check["detail"],
    )
    assert shown, check["detail"]
    d, se = al_b - al_a, math.hypot(se_a, se_b)
    expected = [al_a, al_a - Z * se_a, al_a + Z * se_a, al_b, al_b - Z * se_b, al_b + Z * se_b,
                d, d - Z * se, d + Z * se]  # fmt: skip
    assert [float(v) for v in shown.groups()] == pytest.approx(expected, abs=0.0006)
    # a sum of the SEs would widen the difference's interval by about 0.3 each side
    assert Z * (se_a + se_b - se) > 0.2
