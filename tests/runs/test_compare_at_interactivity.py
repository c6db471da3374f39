"""``compare --at-interactivity X``: each input's tok/s/GPU at X read off its own Pareto curve,
with its interval, and which input wins; the same sentence as ``sim --at-interactivity``; the
decision first on the page; tables headed by the run labels; empty tables that say why; the
sweep page's model, chip, engine and K."""

from __future__ import annotations

import itertools
import logging
import math
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from comparekit import write_run
from ksweepkit import k_sweep, load_sweep
from speclens.cli import app
from speclens.runs import compare as cmp
from speclens.runs import compare_decide as cd
from speclens.runs.compare_deltas import ONE_RUN_EACH
from speclens.runs.compare_inputs import Input, read_inputs
from speclens.runs.decision import Choice, headline
from speclens.runs.html import Page
from speclens.runs.html_compare import write_compare_report
from speclens.runs.html_sweep import write_sweep_report
from speclens.sim import decide as sim_decide


def _linear(points: list[tuple[float, float]], x: float) -> float | None:
    """The Pareto front's y at x, computed apart from compare.py: sort by x; keep a point when
    no point at higher x has a higher y; linear between neighbours."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] > p[1] for q in points)]
    front.sort()
    for (x0, y0), (x1, y1) in itertools.pairwise(front):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def _points(item: Input) -> list[tuple[float, float]]:
    return [(p.figures["tokens_per_s_per_user"].mean,
             p.figures["output_tokens_per_s"].mean / item.gpus) for p in item.points]  # fmt: skip


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Input], dict[str, Any]]:
    root = tmp_path_factory.mktemp("two")
    paths = [load_sweep(root / "h200", 1.0), load_sweep(root / "b300", 1.6)]
    inputs = read_inputs(paths, ["h200", "b300"], [1, 1])
    return inputs, cmp.compare(inputs, metric="output")


def _inside(inputs: list[Input]) -> float:
    """An interactivity both inputs' curves span, between points (so it is interpolated)."""
    spans = [sorted(x for x, _ in _points(item)) for item in inputs]
    low, high = max(s[0] for s in spans), min(s[-1] for s in spans)
    assert low < high
    return low + 0.37 * (high - low)


def test_each_input_is_read_on_its_own_curve_with_its_interval(two: Any) -> None:
    inputs, _ = two
    x = _inside(inputs)
    decision = cd.decide(inputs, x)
    for item, entry in zip(inputs, decision["choices"], strict=True):
        expected = _linear(_points(item), x)
        assert expected is not None
        assert entry["label"] == item.label
        assert entry["tok_s_gpu"] == pytest.approx(expected, rel=1e-9)
        assert entry["low"] < entry["tok_s_gpu"] < entry["high"]
    h200, b300 = decision["choices"]
    assert decision["best"] == "b300" and b300["ratio_to_best"] == pytest.approx(1.0)
    assert h200["ratio_to_best"] == pytest.approx(h200["tok_s_gpu"] / b300["tok_s_gpu"])
    gain = decision["gain_over_first"]
    assert gain["ratio"] == pytest.approx(b300["tok_s_gpu"] / h200["tok_s_gpu"])
    assert gain["low"] < gain["ratio"] < gain["high"]
    assert decision["headline"].startswith(
        f"at {x:g} tok/s/user, b300 delivers {b300['tok_s_gpu']:,.0f} output tok/s/GPU (95% CI "
    )
    assert f"{gain['ratio'] - 1:+.1%} (95% CI " in decision["headline"]
    # one round each: the highest, not the best
    assert decision["headline"].endswith(
        "over h200 (highest of h200, b300; not resolved: fewer than 3 rounds a side (h200: 1, "
        "b300: 1))"
    )
    # one round a point: the interval is request-to-request only, and said so
    assert decision["interval"] == ONE_RUN_EACH


def test_an_input_whose_curve_misses_the_target_says_what_it_spans(two: Any) -> None:
    inputs, _ = two
    xs = sorted(x for x, _ in _points(inputs[0]))
    beyond = xs[-1] * 1.5
    decision = cd.decide(inputs, beyond)
    h200 = decision["choices"][0]
    assert h200["tok_s_gpu"] is None and h200["ratio_to_best"] is None
    assert h200["reason"].startswith("its curve spans ") and f"not {beyond:g}" in h200["reason"]
    # b300 is 1.6 times as fast: its curve reaches 1.5 times h200's fastest point
    assert decision["best"] == "b300"
    assert decision["headline"].endswith(
        f" (best of h200, b300); h200 do not reach {beyond:g} tok/s/user (see the table)"
    )
    assert " over h200" not in decision["headline"]  # no gain over an input with no figure
    nobody = cd.decide(inputs, beyond * 10)
    assert nobody["best"] is None
    assert (
        nobody["headline"] == f"at {beyond * 10:g} tok/s/user, no input reaches that "
        "interactivity (h200, b300)"
    )


def test_the_sentence_is_the_one_sim_prints() -> None:
    """sim's sentence, word for word, in each of its shapes: a K that does not reach, no
    speculation first, no K reaching (every curve too fast), one K alone."""
    cases = [
        ([(1, 300.0), (2, 410.0), (3, None)],
         "at 40 tok/s/user, K 2 delivers 410 output tok/s/GPU, +36.7% over K 1 (best of K 1..3); K 3 "
         "do not reach 40 tok/s/user (see the table)"),
        ([(0, 250.0), (1, 300.0), (4, 280.0)],
         "at 40 tok/s/user, K 1 delivers 300 output tok/s/GPU, +20.0% over no speculation (best of no "
         "speculation, K 1, 4)"),  # the Ks that ran: K 2 and 3 did not
        ([(1, None), (2, None)],
         "at 40 tok/s/user, no K reaches that interactivity (K 1..2): every curve's slowest "
         "point is faster (the batch stops growing: raise the concurrency or max_num_seqs)"),
        ([(2, 500.0)], "at 40 tok/s/user, K 2 delivers 500 output tok/s/GPU (best of K 2)"),
    ]  # fmt: skip
    for case, sentence in cases:
        ks = [{"num_spec_tokens": k, "tok_s_gpu": v, "curve": [{"tok_s_user": 90.0}]}
              for k, v in case]  # fmt: skip
        reached = [e for e in ks if e["tok_s_gpu"] is not None]
        best = max(reached, key=lambda e: e["tok_s_gpu"]) if reached else None
        assert sim_decide.headline(ks, best, 40) == sentence


_SIM_SCENARIO = {
    "model": "kimi-k3", "hardware": "b300",
    "deployment": {"pools": [{"parallel": 8, "engine": {
        "speculative": {"method": "dspark", "num_spec_tokens": 7}, "max_num_seqs": 64}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 256,
                 "output_tokens": 128, "concurrency": 8, "requests": 24},
}  # fmt: skip


def _cli(*args: str | Path) -> str:
    try:
        result = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        logging.getLogger().handlers.clear()
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def sim_grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict[str, Any]]:
    """sim's K x concurrency grid at 150 tok/s/user written as a sweep directory, then that
    directory compared whole at 150: (sim's first line, compare's first line, sim's decision)."""
    root = tmp_path_factory.mktemp("simgrid")
    scenario = root / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(_SIM_SCENARIO))
    grid = root / "grid"
    sim_out = _cli("sim", scenario, "--sweep", "num_spec_tokens=1..2", "--sweep",
                   "concurrency=2,4,8", "--at-interactivity", "150", "--output-dir", grid,
                   "--jobs", "1")  # fmt: skip
    cmp_out = _cli("compare", grid, "--at-interactivity", "150", "--metric", "output")
    decision = orjson.loads((grid / "decision.json").read_bytes())
    return sim_out.splitlines()[0], cmp_out.splitlines()[0], decision


_CI = re.compile(r" \(95% CI [^)]*\)")
_NUMBER = re.compile(r"[+-]?[\d,]+(\.\d+)?")


@pytest.mark.slow
def test_compare_words_sims_grid_as_sim_does(sim_grid: Any) -> None:
    """compare's first line on sim's grid is sim's first line, its throughput named: the best
    K's figure banded by the expected error sim recorded (``provenance.trust``, not a simulated
    run's spread over its requests), the lead's interval from the two bands, and so not
    resolved. The same best K, the same words besides."""
    sim_line, cmp_line, simulated = sim_grid
    assert all(e["tok_s_gpu"] is not None for e in simulated["ks"])  # both Ks reach 150
    assert sim_line.startswith(f"at 150 tok/s/user, K {simulated['best']} delivers ")
    assert cmp_line.startswith(f"at 150 tok/s/user, K {simulated['best']} delivers ")
    band = re.compile(r" \(predicted, expected range [\d,]+ to [\d,]+\)")
    assert len(band.findall(cmp_line)) == 1 and len(_CI.findall(cmp_line)) == 1, cmp_line
    unresolved = "; not resolved: the lead is inside its 95% interval)"
    assert cmp_line.endswith(unresolved), cmp_line
    same = _CI.sub("", band.sub("", cmp_line)).replace("(highest of", "(best of")
    same = same.replace(unresolved, ")")
    assert _NUMBER.sub("N", same) == _NUMBER.sub("N", sim_line)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="sim's decision and the run directories it writes read different TPOTs (which "
    "requests are the warm-up), so tok/s/user differs by about 1%",
)
def test_compare_reads_sims_grid_at_sims_figures(sim_grid: Any) -> None:
    sim_line, cmp_line, _ = sim_grid
    assert _CI.sub("", cmp_line) == sim_line


def test_a_headline_with_intervals_states_them() -> None:
    line = headline([Choice("K 1", 100.0, 90.0, 110.0), Choice("K 2", 150.0, 140.0, 160.0)],
                    40, "K 1..2", gain=(1.5, 1.3, 1.7))  # fmt: skip
    assert line == ("at 40 tok/s/user, K 2 delivers 150 tok/s/GPU (95% CI 140 to 160), +50.0% "
                    "(95% CI +30.0% to +70.0%) over K 1 (best of K 1..2)")  # fmt: skip


def test_the_page_leads_with_the_decision_and_heads_tables_with_labels(
    two: Any, tmp_path: Path
) -> None:
    inputs, result = two
    result = dict(result, decision=cd.decide(inputs, _inside(inputs)))
    page = write_compare_report(tmp_path, result).read_text()
    assert page.index("<h2>") == page.index("<h2>Decision</h2>")
    assert page.index("<h2>Decision</h2>") < page.index("<caption>Inputs</caption>")
    assert result["decision"]["headline"].replace("'", "&#x27;") in page
    for j, entry in enumerate(result["decision"]["choices"]):
        assert f'data-field="decision.choices[{j}].tok_s_gpu"' in page
        assert f'data-field="decision.choices[{j}].low"' in page, entry
    headers = re.findall(r"<th>([^<]*)</th>", page)
    assert "h200" in headers and "b300" in headers and "b300 / h200" in headers
    assert "h200 output tok/s/GPU" in headers and "b300 output tok/s/GPU" in headers
    assert not {"A", "B", "B / A", "A tok/s/GPU", "B tok/s/GPU"} & set(headers)


def test_an_empty_table_says_why() -> None:
    page = Page("t", "x.json")
    page.table("At matched concurrency", ["concurrency", "a", "b"], [],
               empty="no load that both a and b ran")  # fmt: skip
    html = page.render()
    assert "<table>" not in html
    assert "At matched concurrency" in html and "no load that both a and b ran" in html


def test_a_pair_with_no_common_load_says_so_instead_of_an_empty_table(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", concurrency=2, requests=8)
    b = write_run(tmp_path / "b", concurrency=4, requests=8, seed=1)
    result = cmp.compare(read_inputs([a, b], ["h200", "b300"], [1, 1]))
    page = write_compare_report(tmp_path / "out", result).read_text()
    assert "no load that both h200 and b300 ran" in page
    captions = re.findall(r"<caption>([^<]*)</caption>", page)
    assert not any(c.startswith("At matched concurrency") for c in captions)


def test_the_sweep_page_shows_model_chip_engine_and_k(tmp_path: Path) -> None:
    sweep = k_sweep(tmp_path / "s", {1: 1.0, 3: 1.2})
    for point in (sweep / "points").iterdir():
        summary = orjson.loads((point / "summary.json").read_bytes())
        summary["server"]["hardware"] = "b300"
        (point / "summary.json").write_bytes(orjson.dumps(summary))
    page = write_sweep_report(sweep).read_text()
    identity = re.search(r'<p class="identity">(.*?)</p>', page)
    assert identity is not None
    text = re.sub(r"<[^>]+>", "", identity.group(1))
    assert text == "model dummy · chip b300 · engine speclens · K 1, 3 (draft_model)"
    assert page.index('class="identity"') < page.index("<table>")


def test_a_sweep_page_without_a_chip_says_it_is_not_recorded(tmp_path: Path) -> None:
    page = write_sweep_report(k_sweep(tmp_path / "s", {2: 1.0})).read_text()
    assert "chip <strong>not recorded</strong>" in page


def test_interval_bounds_are_finite_and_ordered(two: Any) -> None:
    inputs, _ = two
    decision = cd.decide(inputs, _inside(inputs))
    for entry in decision["choices"]:
        assert all(math.isfinite(entry[k]) for k in ("low", "high", "ratio_low", "ratio_high"))
        assert entry["ratio_low"] <= entry["ratio_to_best"] <= entry["ratio_high"]


def test_each_k_of_a_compared_sweep_plots_its_own_points_only(tmp_path: Path) -> None:
    from speclens.runs.html import Fields
    from speclens.runs.html_compare import input_series

    sweep = tmp_path / "s"
    sweep.mkdir()

    def stat(k: int, c: int) -> dict[str, Any]:
        figures = {"tokens_per_s_per_user": {"mean": 100.0 / c}, "output_tokens_per_s": {
            "mean": 10.0 * c * k}}  # fmt: skip
        return {"engine": None, "rounds_ok": 1, "figures": figures,
                "settings": {"concurrency": c, "request_rate": None,
                             "num_speculative_tokens": k, "acceptance_length": None}}  # fmt: skip

    doc = {"schema": "speclens.sweep/1", "points": [],
           "stats": [stat(k, c) for k in (1, 2) for c in (1, 2, 4)]}  # fmt: skip
    (sweep / "sweep.json").write_bytes(orjson.dumps(doc))
    select = {"engine": None, "num_speculative_tokens": 2, "acceptance_length": None}
    data = {"inputs": [{"label": "K 2", "path": str(sweep), "gpus": 1, "select": select}]}
    (series,) = input_series(Fields(data), 0, tmp_path)
    assert series.y == [20.0, 40.0, 80.0]


def test_each_interval_is_z_times_the_interpolated_se(two: Any) -> None:
    """One round a point: each point's interval is a bootstrap over its requests (normal, SE =
    half-width / z); between the two curve points around X, weights 1 - w and w, the figure's
    SE is sqrt((1 - w)^2 SE0^2 + w^2 SE1^2) and its interval +-z SE."""
    inputs, _ = two
    x = _inside(inputs)
    z = float(stats.norm.ppf(0.975))
    decision = cd.decide(inputs, x)
    for item, entry in zip(inputs, decision["choices"], strict=True):
        assert item.gpus == 1
        figures = [p.figures for p in item.points]
        assert all(f["output_tokens_per_s"].method == "bootstrap" for f in figures)
        xy = {(f["tokens_per_s_per_user"].mean, f["output_tokens_per_s"].mean): f
              for f in figures}  # fmt: skip
        front = sorted(p for p in xy if not any(q[0] >= p[0] and q[1] > p[1] for q in xy))
        ((x0, _), f0), ((x1, _), f1) = next(
            ((a, xy[a]), (b, xy[b])) for a, b in itertools.pairwise(front) if a[0] <= x <= b[0]
        )
        w = (x - x0) / (x1 - x0)
        se0, se1 = (f["output_tokens_per_s"].half_width / z for f in (f0, f1))
        half = z * math.sqrt((1 - w) ** 2 * se0**2 + w**2 * se1**2)
        y = entry["tok_s_gpu"]  # on the log scale: log y's SE is SE / y
        assert entry["low"] == pytest.approx(y * math.exp(-half / y), rel=1e-9)
        assert entry["high"] == pytest.approx(y * math.exp(half / y), rel=1e-9)


def test_a_lead_from_one_run_each_is_never_called_significant(two: Any) -> None:
    inputs, _ = two
    decision = cd.decide(inputs, _inside(inputs))
    gain = decision["gain_over_first"]
    assert gain["low"] > 1  # clear of 1 on request-to-request variation alone
    assert decision["lead"] == (
        "b300's lead over h200: not resolved, fewer than 3 rounds a side (h200: 1, b300: 1)"
    )
    assert decision["resolved"] is False
