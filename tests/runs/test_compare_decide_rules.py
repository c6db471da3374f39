"""The rules of ``compare --at-interactivity`` (``runs.compare_decide``) on inputs built by hand,
each figure with an interval of known width: the 95% interval is t x SE with the Welch degrees of
freedom, which input is best, the gain over the first, the lead over the runner-up and when it
is a clear win, how one sweep's choices are named, and the lines the terminal prints. Every
expected number is worked out here, apart from the code."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from speclens.runs import compare_decide as cd
from speclens.runs.compare_deltas import ONE_RUN_EACH
from speclens.runs.compare_inputs import Input, Point
from speclens.runs.decision import TOO_FAST
from speclens.runs.rundir import InputError, Run
from speclens.runs.stats import Interval

STUDENT = "95% intervals across rounds (Student t, on the log scale)"


def _t(df: float) -> float:
    return float(stats.t.ppf(0.975, df))


def _point(x: float, y: float, half: float, *, rounds: int = 0, **settings: Any) -> Point:
    """A point at ``x`` tok/s/user delivering ``y`` tok/s with a 95% interval of +-``half``:
    Student t over ``rounds`` rounds, or (rounds 0) a bootstrap over 100 requests."""
    engine = settings.pop("engine", None)
    method = "t" if rounds else "bootstrap"
    figures = {
        "tokens_per_s_per_user": Interval(x, x, x, 100, "bootstrap"),
        "output_tokens_per_s": Interval(y, y - half, y + half, rounds or 100, method),
    }
    return Point({"concurrency": 1, **settings}, engine, [], figures)


def _input(label: str, *points: Point, runs: list[Run] | None = None) -> Input:
    if runs is not None:
        points[0].runs.extend(runs)
    return Input(label, Path(label), "sweep", list(points))


def _flat(label: str, y: float, half: float, rounds: int = 3) -> Input:
    """An input whose curve falls from 1.1 ``y`` at 10 tok/s/user to 0.9 ``y`` at 30, both
    with the interval +-``half``: at 20 it reads ``y`` (``_at_20`` gives its SE and df)."""
    return _input(label, _point(10, 1.1 * y, half, rounds=rounds),
                  _point(30, 0.9 * y, half, rounds=rounds))  # fmt: skip


def _at_20(half: float, rounds: int = 3) -> tuple[float, float]:
    """A ``_flat`` input's SE and degrees of freedom at 20 tok/s/user: halfway, each end
    weighs 1/2, so the variance is half an end's and Welch's df twice an end's."""
    df = rounds - 1 if rounds else math.inf
    se = half / (_t(df) if rounds else float(stats.norm.ppf(0.975)))
    return se / math.sqrt(2), 2 * df


def test_the_interval_is_t_times_the_interpolated_se_on_welch_df() -> None:
    # (10, 100) with +-8 over 3 rounds, (30, 50) with +-6 over 5 rounds; at 15: w = 0.25.
    item = _input("a", _point(10, 100, 8, rounds=3), _point(30, 50, 6, rounds=5))
    (entry,) = cd.decide([item], 15)["choices"]
    se1, se2 = 8 / _t(2), 6 / _t(4)
    v1, v2 = (0.75 * se1) ** 2, (0.25 * se2) ** 2
    df = (v1 + v2) ** 2 / (v1**2 / 2 + v2**2 / 4)
    half = _t(df) * math.sqrt(v1 + v2)
    assert entry["tok_s_gpu"] == pytest.approx(87.5, rel=1e-12)
    # on the log scale: log y's SE is se / y (delta method), so the bounds are y exp(-+t se / y)
    assert entry["low"] == pytest.approx(87.5 * math.exp(-half / 87.5), rel=1e-9)
    assert entry["high"] == pytest.approx(87.5 * math.exp(half / 87.5), rel=1e-9)
    assert half > 1.1 * 1.96 * math.sqrt(v1 + v2)  # the t quantile, not the normal's, nor 1
    assert entry["interval_basis"] == "rounds"


def test_one_repeated_input_at_a_point_keeps_the_points_own_interval() -> None:
    (entry,) = cd.decide([_input("a", _point(10, 100, 8, rounds=3))], 10)["choices"]
    # +-8 on 100 as t x SE: on the log scale 100 exp(-+0.08)
    assert (entry["low"], entry["high"]) == pytest.approx((100 * math.exp(-0.08),
                                                           100 * math.exp(0.08)), rel=1e-12)  # fmt: skip


def test_the_best_is_the_highest_and_its_gain_is_over_the_first() -> None:
    a, b, c = _flat("a", 100, 2), _flat("b", 150, 2), _flat("c", 120, 2)
    decision = cd.decide([a, b, c], 20)
    assert decision["best"] == "b" and decision["best_tok_s_gpu"] == pytest.approx(150)
    assert decision["gain_over_first"]["ratio"] == pytest.approx(1.5)
    assert [e["ratio_to_best"] for e in decision["choices"]] == pytest.approx([2 / 3, 1, 0.8])
    assert decision["headline"].startswith(
        "at 20 tok/s/user, b delivers 150 output tok/s/GPU (95% CI "
    )
    assert ", +50.0% (95% CI " in decision["headline"]
    assert decision["headline"].endswith(" over a (best of a, b, c)")


def test_a_first_input_that_is_best_has_no_gain_over_itself() -> None:
    decision = cd.decide([_flat("a", 150, 2), _flat("b", 100, 2)], 20)
    assert decision["best"] == "a" and decision["gain_over_first"] is None
    assert " over " not in decision["headline"]


def _lead_ci(best: tuple[float, float], second: tuple[float, float]) -> tuple[float, float]:
    """best / second's 95% interval for two ``_flat`` inputs at 20 tok/s/user, each given as
    (figure, half-width at its ends over 3 rounds), on the log scale: each side's relative
    variance (se / mean)^2, the Welch df of the two."""
    (yb, hb), (ys, hs) = best, second
    (seb, df), (ses, _) = _at_20(hb), _at_20(hs)
    vb, vs = (seb / yb) ** 2, (ses / ys) ** 2
    welch = (vb + vs) ** 2 / (vb**2 / df + vs**2 / df)
    spread = _t(welch) * math.sqrt(vb + vs)
    return yb / ys * math.exp(-spread), yb / ys * math.exp(spread)


def test_the_lead_is_over_the_runner_up_with_its_own_interval() -> None:
    # a first (the headline's gain is over it), c the runner-up, b best: clear of 1 on rounds.
    decision = cd.decide([_flat("a", 50, 1), _flat("b", 150, 2), _flat("c", 120, 2)], 20)
    low, high = _lead_ci((150, 2), (120, 2))
    assert low > 1
    assert decision["lead"] == (
        f"b's lead over c, +25.0% (95% CI {low - 1:+.1%} to {high - 1:+.1%}): resolved"
    )
    assert decision["resolved"] is True


def test_a_lead_over_the_first_input_leaves_its_figure_to_the_headline() -> None:
    decision = cd.decide([_flat("a", 120, 2), _flat("b", 150, 2)], 20)
    assert decision["lead"] == "b's lead over a: resolved"
    assert ", +25.0% (95% CI " in decision["headline"]


def test_a_lead_whose_interval_reaches_1_is_not_a_clear_win() -> None:
    decision = cd.decide([_flat("a", 50, 1), _flat("b", 102, 6), _flat("c", 100, 6)], 20)
    low, high = _lead_ci((102, 6), (100, 6))
    assert low < 1 < high
    assert decision["lead"].endswith(": not resolved, the lead is inside its 95% interval")
    assert decision["headline"].endswith(
        "(highest of a, b, c; not resolved: the lead is inside its 95% interval)"
    )
    assert decision["lead"].startswith(f"b's lead over c, +2.0% (95% CI {low - 1:+.1%} to ")


def test_a_tie_is_not_a_win() -> None:
    """Two inputs with the same figure and no spread: the ratio's interval is exactly 1 to 1,
    which is not clear of 1."""
    same = [_flat(label, 100, 0) for label in ("x", "a", "b")]
    same[0] = _flat("x", 50, 0)
    decision = cd.decide(same, 20)
    assert decision["lead"] == (
        "a's lead over b, +0.0% (95% CI +0.0% to +0.0%): not resolved, the lead is inside its "
        "95% interval"
    )


def test_a_lead_is_only_significant_when_both_sides_repeated() -> None:
    # b repeated over 3 rounds, c one run (a bootstrap over its requests): not significant
    for second_rounds in (0, 3):
        decision = cd.decide(
            [_flat("a", 50, 1), _flat("b", 150, 1), _flat("c", 100, 1, rounds=second_rounds)], 20
        )
        repeated = second_rounds > 0
        assert decision["lead"].endswith(
            ": not resolved, fewer than 3 rounds a side (b: 3, c: 1)"
        ) is (not repeated), decision["lead"]
        assert decision["lead"].endswith(": resolved") is repeated
        assert decision["interval"] == (STUDENT if repeated else ONE_RUN_EACH)


def test_a_lead_over_a_choice_of_no_throughput_has_no_interval_and_no_figure() -> None:
    decision = cd.decide([_flat("a", 150, 1), _input("b", _point(20, 0, 1, rounds=3))], 20)
    assert decision["lead"] == "a's lead over b: no interval (b reads 0), not resolved"


def test_one_choice_reaching_the_target_has_no_lead() -> None:
    decision = cd.decide([_flat("a", 150, 1), _input("b", _point(90, 10, 1))], 20)
    assert decision["best"] == "a" and "lead" not in decision


def test_an_input_is_on_rounds_only_when_every_point_repeated() -> None:
    mixed = _input("m", _point(10, 100, 2, rounds=3), _point(30, 50, 2))
    decision = cd.decide([_flat("a", 80, 2), mixed], 15)
    assert [e["interval_basis"] for e in decision["choices"]] == ["rounds", "requests"]
    assert decision["interval"] == ONE_RUN_EACH
    assert cd.decide([_flat("a", 80, 2), _flat("b", 90, 2)], 15)["interval"] == STUDENT


def test_an_inputs_k_is_named_only_when_it_has_one() -> None:
    one = _input("one", _point(10, 100, 2, num_speculative_tokens=3), _point(30, 50, 2))
    two = _input("two", _point(10, 100, 2, num_speculative_tokens=3),
                 _point(30, 50, 2, num_speculative_tokens=4))  # fmt: skip
    summary = {"settings": {"num_speculative_tokens": 5}, "figures": {}}
    from_runs = _input("runs", _point(10, 100, 2), _point(30, 50, 2),
                       runs=[Run(Path("r"), summary, [])])  # fmt: skip
    ks = [e["num_spec_tokens"] for e in cd.decide([one, two, from_runs], 20)["choices"]]
    assert ks == [3, None, 5]


def _curve(label: str, low: float, high: float) -> Input:
    return _input(label, _point(low, 100, 2), _point(high, 50, 2))


def test_no_input_reaching_says_why_only_when_every_curve_is_too_fast() -> None:
    fast, slow = _curve("fast", 50, 100), _curve("slow", 20, 30)
    below_all = cd.decide([fast, slow], 10)
    assert below_all["headline"] == (
        f"at 10 tok/s/user, no input reaches that interactivity (fast, slow): {TOO_FAST}"
    )
    assert below_all["best"] is None and below_all["interval"].startswith("no interval")
    between = cd.decide([fast, slow], 40)
    assert between["headline"] == (
        "at 40 tok/s/user, no input reaches that interactivity (fast, slow)"
    )


def test_the_span_names_ks_only_for_the_ks_of_one_sweep() -> None:
    a = _input("a", _point(10, 100, 2, rounds=3, num_speculative_tokens=1),
               _point(30, 50, 2, rounds=3))  # fmt: skip
    b = _input("b", _point(10, 120, 2, rounds=3, num_speculative_tokens=2),
               _point(30, 60, 2, rounds=3))  # fmt: skip
    assert cd.decide([a, b], 20)["headline"].endswith("(best of a, b)")
    assert cd.decide([a, b], 20, by_k=True)["headline"].endswith("(best of K 1..2)")
    assert cd.decide([a, b], 5, by_k=True)["headline"].startswith(
        "at 5 tok/s/user, no K reaches that interactivity (K 1..2)"
    )


def test_each_reason_a_choice_has_no_figure() -> None:
    summary = {"aggregate_only": True, "settings": {"model": "m"}, "figures": {}}
    published = Point({"concurrency": 1}, None, [Run(Path("p"), summary, [])], {
        "tokens_per_s_per_user": Interval(20, math.nan, math.nan, 1, "none"),
        "output_tokens_per_s": Interval(100, math.nan, math.nan, 1, "none"),
    })  # fmt: skip
    inputs = [
        _flat("a", 100, 2),
        _curve("span", 25, 40.25),
        _input("one", _point(30, 100, 2)),
        Input("pub", Path("pub"), "run", [published]),
        Input("none", Path("none"), "run", [dataclass_copy(published, runs=[])]),
    ]
    reasons = [e.get("reason") for e in cd.decide(inputs, 20)["choices"]]
    assert reasons == [
        None,
        "its curve spans 25.0 to 40.2 tok/s/user, not 20",
        "its one point is at 30.0 tok/s/user, not 20",
        "aggregate-only: publishes no interactivity with output tokens/s per GPU",
        "no point with TPOT and throughput",
    ]


def dataclass_copy(point: Point, **changes: Any) -> Point:
    import dataclasses

    return dataclasses.replace(point, **changes)


def test_the_terminal_lines() -> None:
    a, b = _flat("a", 50, 10), _flat("b", 150, 10)
    decision = cd.decide([a, b, _curve("far", 50, 60)], 20)
    se, df = _at_20(10)
    half = _t(df) * se
    lines = cd.decision_lines(decision)
    assert lines[0] == decision["headline"]
    assert lines[1] == "b's lead over a: resolved"

    def ci(y: float) -> str:
        return f"95% CI {y * math.exp(-half / y):,.0f} to {y * math.exp(half / y):,.0f}"

    assert lines[2].startswith(f"  a: 50 output tok/s/GPU ({ci(50)}), "
                               "0.333x of the best (95% CI 0.")  # fmt: skip
    assert lines[3].startswith(f"  b: 150 output tok/s/GPU ({ci(150)}), 1.000x of the best "
                               "(95% CI 0.")  # fmt: skip
    assert lines[4] == "  far: its curve spans 50.0 to 60.0 tok/s/user, not 20"
    assert lines[5] == f"  (output tokens/s per GPU; {STUDENT})"
    assert len(lines) == 6


# --- one sweep compared whole: its choices and their names -----------------------------------


def _sweep(
    *keys: tuple[str | None, int | None, float | None], load: str = "concurrency"
) -> list[Input]:
    """One sweep's points (two loads each) at the given (engine, K, forced AL) choices, as
    ``read_inputs`` reads it: one input per engine."""
    by_engine: dict[str | None, list[Point]] = {}
    for engine, k, al in keys:
        for c in (1, 4):
            settings = {load: c, "num_speculative_tokens": k, "acceptance_length": al}
            point = _point(100 / c, 10 * c, 1, engine=engine, **settings)
            point.settings.pop("concurrency") if load != "concurrency" else None
            by_engine.setdefault(engine, []).append(point)
    return [Input(str(e), Path("s"), "sweep", pts) for e, pts in by_engine.items()]


@pytest.mark.parametrize(
    ("keys", "labels"),
    [
        ([(None, 1, None), (None, 2, None)], ["K 1", "K 2"]),
        ([("vllm", 1, None), ("vllm", 2, None)], ["K 1", "K 2"]),
        ([(None, 2, 2.5), (None, 1, 2.5)], ["K 1", "K 2"]),
        ([("sglang", 4, None), ("vllm", 4, None)], ["sglang", "vllm"]),
        ([("vllm", 4, None), ("sglang", 2, None)], ["sglang K 2", "vllm K 4"]),
        ([(None, 4, None), (None, 4, 3.0), (None, 4, 2.5)], ["AL 2.5", "AL 3", "natural AL"]),
        ([(None, None, None), (None, 2, None)], ["K 2", "K unknown"]),
    ],
)
def test_a_sweeps_choices_are_named_by_what_varies(keys: Any, labels: list[str]) -> None:
    split = cd.split_sweep(_sweep(*keys))
    assert [item.label for item in split] == labels
    assert all(len(item.points) == 2 for item in split)
    for item in split:
        select = cd.selection(item)
        assert {(p.engine, p.settings["num_speculative_tokens"], p.settings["acceptance_length"])
                for p in item.points} == {tuple(select.values())}  # fmt: skip


def test_a_sweep_is_compared_on_k_only_where_k_varies() -> None:
    _, by_engine = cd.whole_sweep(_sweep(("sglang", 4, None), ("vllm", 4, None)), [])
    assert by_engine == []
    _, by_k = cd.whole_sweep(_sweep((None, 1, None), (None, 2, None)), ["engine"])
    assert by_k == ["engine", "k"]


@pytest.mark.parametrize(("load", "said"), [("concurrency", "concurrency"),
                                            ("request_rate", "request rate")])  # fmt: skip
def test_a_sweep_of_one_choice_names_the_load_it_varies(load: str, said: str) -> None:
    with pytest.raises(InputError) as caught:
        cd.split_sweep(_sweep((None, 2, None), load=load))
    assert caught.value.code == 2
    assert caught.value.lines[0].endswith(f"; its points vary only {said}")


def test_only_one_sweep_directory_alone_is_compared_whole(tmp_path: Path) -> None:
    sweep, run = tmp_path / "s", tmp_path / "r"
    for path in (sweep, run):
        path.mkdir()
    (sweep / "sweep.json").write_text("{}")
    assert cd.sweep_dir_path([sweep]) == sweep
    assert cd.sweep_dir_path([sweep, run]) is None
    assert cd.sweep_dir_path([run]) is None
