"""Reports read top-down, with one throughput, named.

The sweep is real: ``speclens sim --sweep num_spec_tokens=1,3 --sweep concurrency=1,4
--at-interactivity X --output-dir`` on 8 GPUs. Its page opens with the decision and each
setting's peak, draws one line per K with a legend entry each, says "(95% CI)" only where it
draws an interval, and reads output tokens/s throughout (per GPU where the decision does). A
run page opens with its verdict and a few figures; a category with no verify step reads "no
data" (on the page, in its plot and in the console), never the 1.0 of the empty formula.
"""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from rich.console import Console
from typer.testing import CliRunner

from aggregatekit import summary as aggregate_summary
from reportkit import field_mismatches, scan
from speclens.cli import app
from speclens.runs import html_plots as hp
from speclens.runs.html import Fields, Page, check_word, read_json
from speclens.runs.html_aggregate import aggregate_page
from speclens.runs.html_run import Samples, run_page
from speclens.runs.html_sweep import decision_section, sweep_page
from speclens.runs.report import print_summary

SCENARIO = {
    "model": "kimi-k3", "hardware": "b300",
    "deployment": {"pools": [{"role": "mixed", "parallel": 8, "engine": {
        "speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": {"min": 16, "max": 64},
                 "output_tokens": {"min": 8, "max": 48}, "concurrency": 4, "requests": 24},
}  # fmt: skip
KS, LOADS, GPUS = (1, 3), (1, 4), 8


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("top-down")
    scenario = root / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out = root / "sweep"
    args = ["sim", str(scenario), "--sweep", "num_spec_tokens=" + ",".join(map(str, KS)),
            "--sweep", "concurrency=" + ",".join(map(str, LOADS)), "--at-interactivity", "150",
            "--jobs", "1", "--output-dir", str(out)]  # fmt: skip
    try:
        result = CliRunner().invoke(app, args)
    finally:
        logging.getLogger().handlers.clear()
    assert result.exit_code == 0, result.stderr
    return out


def _page(directory: Path) -> str:
    return (directory / "report.html").read_text(encoding="utf-8")


def _figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """Each plot's figure by name, kept as the page renders it."""
    kept: dict[str, Figure] = {}
    original = hp.to_svg

    def keep(fig: Figure, name: str) -> str:
        kept[name] = fig
        return original(fig, name)

    monkeypatch.setattr(hp, "to_svg", keep)
    return kept


def _render_sweep(
    directory: Path, monkeypatch: pytest.MonkeyPatch, sweep: dict[str, Any] | None = None
) -> tuple[str, dict[str, Figure]]:
    figures = _figures(monkeypatch)
    decision = orjson.loads((directory / "decision.json").read_bytes())
    data = sweep if sweep is not None else read_json(directory / "sweep.json")
    return sweep_page(data, directory, decision).render(), figures


def _lines(fig: Figure) -> list[tuple[str, list[float], list[float]]]:
    """Each legend entry's label and the x and y of the line it names."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels
    out = []
    for handle, name in zip(handles, labels, strict=True):
        assert isinstance(handle, ErrorbarContainer)
        line = handle.lines[0]
        out.append((name, list(line.get_xdata()), list(line.get_ydata())))
    return out


# ------------------------------------------------------------------------------ the sweep page


def test_a_sweep_plot_draws_one_line_per_k_each_in_the_legend(
    sweep_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A K x concurrency sweep: each plot has one line per K, named in the legend, through that
    K's points alone in x order (not one zigzag through every point)."""
    sweep = orjson.loads((sweep_dir / "sweep.json").read_bytes())
    _, figures = _render_sweep(sweep_dir, monkeypatch)
    for name, x_key, y_key, scale in (
        ("pareto", "tokens_per_s_per_user", "output_tokens_per_s", GPUS),
        ("sweep-al", "tpot_ms", "realized_al", 1),
    ):
        lines = _lines(figures[name])
        assert [label for label, _, _ in lines] == [f"K {k}" for k in KS], name
        for k, (_, xs, ys) in zip(KS, lines, strict=True):
            points = sorted(
                (s["figures"][x_key]["mean"], s["figures"][y_key]["mean"] / scale)
                for s in sweep["stats"] if s["settings"]["num_speculative_tokens"] == k
            )  # fmt: skip
            assert len(points) == len(LOADS)
            assert xs == pytest.approx([x for x, _ in points], rel=1e-12), (name, k)
            assert ys == pytest.approx([y for _, y in points], rel=1e-12), (name, k)


def test_ci_is_in_a_plot_title_only_where_an_interval_is_drawn(
    sweep_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated points have bootstrap intervals: drawn, and the titles say so. The same
    sweep with no interval on any figure (as aggregate-only points hold it): no bar, no
    "(95% CI)" in any title or table header."""
    page, figures = _render_sweep(sweep_dir, monkeypatch)
    for fig in figures.values():
        assert fig.axes[0].get_title().endswith(" (95% CI)")
        assert _longest_bar(fig) > 0
    bare = copy.deepcopy(read_json(sweep_dir / "sweep.json"))
    for stat in bare["stats"]:
        for interval in stat["figures"].values():
            interval.update(low=None, high=None, method="none")
    page, figures = _render_sweep(sweep_dir, monkeypatch, bare)
    assert set(figures) == {"pareto", "sweep-al"}
    for fig in figures.values():
        title = fig.axes[0].get_title()
        assert title and "CI" not in title, title
        assert _longest_bar(fig) == 0
    assert "95% CI" not in page


def _longest_bar(fig: Figure) -> float:
    """The longest error bar the plot draws, in data units (0: none drawn)."""
    longest = 0.0
    for container in fig.axes[0].containers:
        assert isinstance(container, ErrorbarContainer)
        for collection in container.lines[2]:
            for segment in collection.get_segments():
                longest = max(longest, float(np.abs(segment[1] - segment[0]).max()))
    return longest


def _order(page: str, *markers: str) -> list[int]:
    return [page.index(m) for m in markers]


def test_the_sweep_page_opens_with_the_decision_and_each_ks_peak(sweep_dir: Path) -> None:
    """Identity, the decision, each K's peak (the point of most output throughput, its load,
    interactivity and AL), then the plots, and the long tables last."""
    page = _page(sweep_dir)
    order = _order(page, 'class="identity"', "<h2>Decision</h2>",
                   "<caption>Peak output throughput per setting", "<h2>Plots</h2>",
                   "<caption>Figures per point", "<caption>Points</caption>")  # fmt: skip
    assert order == sorted(order)
    sweep = orjson.loads((sweep_dir / "sweep.json").read_bytes())
    table = page[page.index("<caption>Peak output throughput") :]
    table = table[: table.index("</table>")]
    rows = table.split("<tr>")[2:]
    assert len(rows) == len(KS)
    for k, row in zip(KS, rows, strict=True):
        mine = [(s["figures"]["output_tokens_per_s"]["mean"], i)
                for i, s in enumerate(sweep["stats"]) if s["settings"]["num_speculative_tokens"] == k]  # fmt: skip
        best = max(mine)[1]
        assert f"K {k}" in row
        for path in (f"stats[{best}].settings.concurrency",
                     f"stats[{best}].figures.output_tokens_per_s.mean",
                     f"stats[{best}].figures.tokens_per_s_per_user.mean",
                     f"stats[{best}].figures.realized_al.mean"):  # fmt: skip
            assert f'data-field="{path}"' in row, (k, path)
    assert (
        field_mismatches(
            [(p, t) for p, t in scan(page).fields if not p.startswith("decision.")], sweep
        )
        == []
    )


def test_the_sweep_page_names_one_throughput(
    sweep_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output tokens/s everywhere, never input + output: per GPU in the decision and the
    Pareto plot (the curve the decision reads, its y the server's output over the 8 GPUs every
    point states), the server's in the tables, each header saying which."""
    page, figures = _render_sweep(sweep_dir, monkeypatch)
    headers = re.findall(r"<th>([^<]*tok/s[^<]*)</th>", page)
    throughput = [h for h in headers if h != "tok/s/user"]
    assert throughput, headers
    assert all(h.startswith("output tok/s") for h in throughput), throughput
    assert "output tok/s/GPU" in throughput  # the decision's
    assert f"output tok/s ({GPUS} GPUs)" in throughput  # the tables'
    assert "total" not in page.lower()
    assert figures["pareto"].axes[0].get_ylabel() == "output tok/s/GPU"
    decision = orjson.loads((sweep_dir / "decision.json").read_bytes())
    for entry in decision["ks"]:  # the decision's own curve points are the plot's
        curve = next(ys for label, _, ys in _lines(figures["pareto"])
                     if label == f"K {entry['num_spec_tokens']}")  # fmt: skip
        assert sorted(p["tok_s_gpu"] for p in entry["curve"]) == pytest.approx(
            sorted(curve), rel=1e-9
        )


# ------------------------------------------------------------------------------ the run page


def _run_summary() -> dict[str, Any]:
    """A run of two categories, one whose requests took no verify step (its AL is the empty
    formula's 1.0), with a verdict."""
    acceptance = {
        "requests_with_stats": 6, "adapters": ["vllm"], "token_weighted_al": 2.5,
        "per_request_al": None, "draft_acceptance_rate": 0.5, "accepted_per_step": 1.5,
        "verify_steps": 40, "histogram": {"0": 10, "1": 10, "2": 10, "3": 10},
        "zero_step_requests": 2, "inconsistent_requests": [],
        "al_by_category": {"coding": {"al": 2.5, "verify_steps": 40},
                           "chat": {"al": 1.0, "verify_steps": 0}},
    }  # fmt: skip
    figures = {
        "requests": {"completed": 8, "failed": 0, "warmup": 0}, "duration_s": 2.0,
        "interrupted": False,
        "throughput": {"requests_per_s": 4.0, "output_tokens_per_s": 320.0,
                       "total_output_tokens": 640, "total_prompt_tokens": 5120},
        "latency_ms": {"ttft": {k: 50.0 for k in ("mean", "p50", "p90", "p99", "min", "max")},
                       "tpot": {k: 5.0 for k in ("mean", "p50", "p90", "p99", "min", "max")}},
        "acceptance": acceptance,
    }  # fmt: skip
    verdict = {"passed": True, "reason": "within the band", "expected_acceptance_length": 2.5,
               "verify_steps": 40, "realized_acceptance_length": 2.5}  # fmt: skip
    return {"settings": {"model": "m"}, "figures": figures, "verdict": verdict, "warnings": []}


def test_a_category_with_no_verify_steps_reads_no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the page, in the AL-per-category plot (no bar at 1.0, a "no data" label on its row)
    and in the console."""
    figures = _figures(monkeypatch)
    page = run_page(_run_summary(), Samples.of([])).render()
    assert "AL (chat)</th><td>no data (" in page
    assert '<span data-field="figures.acceptance.al_by_category.chat.al">' not in page
    ax = figures["categories"].axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == ["coding", "chat"]
    bars = [(round(p.get_y() + p.get_height() / 2), p.get_width()) for p in ax.patches]
    assert bars == [(0, 2.5)]
    assert [(t.get_text(), t.get_position()[1]) for t in ax.texts] == [("no data", 1)]
    console = Console(record=True, width=300)
    print_summary(console, _run_summary())
    text = console.export_text()
    assert re.search(r"AL \(chat\)[\s│]+no data \(0 verify steps\)", text), text
    assert re.search(r"AL \(coding\)[\s│]+2\.5000 over 40 steps", text), text


def test_the_run_page_opens_with_its_verdict_and_a_few_figures() -> None:
    """The verdict, then the few figures (requests, output throughput, AL, TTFT and TPOT),
    then the verification's detail, and the settings and the long tables after them."""
    page = run_page(_run_summary(), Samples.of([])).render()
    order = _order(page, 'class="banner pass"', "<caption>At a glance",
                   "<caption>Verification", "<caption>Settings", "<caption>Latency",
                   "<caption>Acceptance", "<h2>Plots</h2>")  # fmt: skip
    assert order == sorted(order)
    glance = page[page.index("<caption>At a glance") :]
    glance = glance[: glance.index("</table>")]
    for path in ("figures.requests.completed", "figures.throughput.output_tokens_per_s",
                 "figures.acceptance.token_weighted_al", "figures.latency_ms.ttft.p50",
                 "figures.latency_ms.tpot.p50"):  # fmt: skip
        assert f'data-field="{path}"' in glance, path
    assert "output throughput (tok/s)" in glance
    assert "total throughput" not in page and "total_tokens_per_s" not in page


def test_a_run_that_states_its_gpus_shows_output_per_gpu_never_total(
    sweep_dir: Path,
) -> None:
    """A simulated run's summary holds output and input + output tokens/s per GPU: its page
    shows the output figure, named, and no total."""
    point = sweep_dir / "points" / "k1-c1-r0"
    summary = orjson.loads((point / "summary.json").read_bytes())
    assert {"output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu"} <= set(
        summary["figures"]["throughput"]
    )
    page = _page(point)
    assert "output throughput per GPU (tok/s/GPU)" in page
    assert 'data-field="figures.throughput.output_tokens_per_s_per_gpu"' in page
    assert "total_tokens" not in page and "total throughput" not in page


def test_a_published_run_names_output_first_and_total_as_input_plus_output() -> None:
    """A published point states both throughputs: each row says which, output tokens (what
    every decision reads) before input + output, so 1,000 total and 500 output tok/s/GPU at
    1k/1k cannot be read as one figure."""
    page = aggregate_page(aggregate_summary(total_per_gpu=1000.0, isl=1024, osl=1024)).render()
    rows = re.findall(r"<tr><th>([^<]*throughput[^<]*)</th><td[^>]*>(.*?)</td>", page)
    assert [label for label, _ in rows] == [
        "output throughput per GPU (tok/s/GPU)", "output throughput (tok/s)",
        "total throughput per GPU, input + output (tok/s/GPU)",
        "total throughput, input + output (tok/s)",
    ]  # fmt: skip
    assert 'data-field="figures.throughput.output_tokens_per_s_per_gpu">500.0<' in rows[0][1]
    assert 'data-field="figures.throughput.total_tokens_per_s_per_gpu">1,000.0<' in rows[2][1]


def _decision_header(choices: list[dict[str, Any]], figure: str) -> list[str]:
    page = Page("t", "compare.json")
    decision = {"headline": "h", "tok_s_user": 50.0, "choices": choices, "figure": figure,
                "interval": "i"}  # fmt: skip
    decision_section(page, Fields({"decision": decision}))
    header = re.search(r"<caption>at 50 tok/s/user</caption><tr>(.*?)</tr>", page.render())
    assert header is not None
    return re.findall(r"<th>([^<]*)</th>", header.group(1))


def test_a_decision_table_names_its_throughput_and_claims_a_ci_only_with_one() -> None:
    """compare's choices: the column is the decision's own figure, "(95% CI)" only when some
    choice shows an interval (an aggregate-only input has none)."""
    bare = [{"label": "A", "num_spec_tokens": 3, "tok_s_gpu": 500.0, "ratio_to_best": 1.0}]
    assert _decision_header(bare, "output tokens/s per GPU") == [
        "input", "K", "output tokens/s per GPU", "ratio to best"]  # fmt: skip
    with_ci = [{**bare[0], "low": 480.0, "high": 520.0, "ratio_low": 0.9, "ratio_high": 1.1}]
    assert _decision_header(with_ci, "output tokens/s per GPU") == [
        "input", "K", "output tokens/s per GPU (95% CI)", "ratio to best (95% CI)"]  # fmt: skip


def test_a_check_not_required_reads_stated_never_pass() -> None:
    """The wording pages and the console share: a chi-square the pair does not require (natural
    acceptance) states its p, however small, and reads "stated"; a required one passes or
    fails on its own ``ok``; one that did not run reads "n/a"."""
    detail = "chi-square p 2.5e-18 (df 7, 4000 vs 4100 verify steps): stated, not required"
    assert check_word({"name": "histogram", "ok": True, "stated": True, "detail": detail}) == (
        "stated"
    )
    assert [check_word({"ok": ok}) for ok in (True, False, None)] == ["pass", "fail", "n/a"]
