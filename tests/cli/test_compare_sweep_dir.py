"""``speclens compare SWEEP_DIR``: one sweep over K compared whole, each K an input whose points
over concurrency form its curve; with ``--at-interactivity`` the winning K comes first. A sweep
that varies only the load, alone, is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ksweepkit import k_sweep, load_sweep
from speclens.runs.decision import TOO_FAST

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def sim_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """K 1, 2 and 4 (K 4 fastest), points that record no prompts digest (as sim's did)."""
    return k_sweep(tmp_path_factory.mktemp("k") / "k", {1: 1.0, 2: 1.15, 4: 1.4}, prompts=None)


def test_a_k_sweep_alone_is_compared_k_by_k_and_says_which_k_wins(
    run_cli, sim_like: Path, tmp_path: Path
) -> None:
    code, out, err = run_cli("compare", sim_like, "--json")
    assert code == 0, err + out
    result = json.loads(out)
    assert [i["label"] for i in result["inputs"]] == ["K 1", "K 2", "K 4"]
    assert [i["select"]["num_speculative_tokens"] for i in result["inputs"]] == [1, 2, 4]
    assert all(i["points"] == 4 for i in result["inputs"])
    # each K against the first, comparable: one sweep's points share their workload
    assert [(p["a"], p["b"]) for p in result["pairs"]] == [("K 1", "K 2"), ("K 1", "K 4")]
    assert all(p["comparable"] for p in result["pairs"]), result["pairs"][0]["label"]
    k4 = result["pairs"][1]["deltas"]["matched_concurrency"]
    throughput = [r for r in k4 if r["figure"] == "total_tokens_per_s"]  # the default metric
    assert throughput and all(r["ratio"] > 1 for r in throughput)
    code, out, err = run_cli("compare", sim_like, "--json", "--at-interactivity", "1")
    # 1 tok/s/user is below every curve here: no K reaches it, still exit 0 (all comparable)
    assert code == 0, err
    decision = json.loads(out)["decision"]
    curves = [c["curve"] for c in decision["choices"]]
    assert all(c[0]["tok_s_user"] > 1 for c in curves)
    assert decision["best"] is None and decision["gain_over_first"] is None
    assert [c["tok_s_gpu"] for c in decision["choices"]] == [None] * 3
    assert decision["headline"] == (
        f"at 1 tok/s/user, no K reaches that interactivity (K 1..2, 4): {TOO_FAST}"
    )
    low = max(c[0]["tok_s_user"] for c in curves)
    high = min(c[-1]["tok_s_user"] for c in curves)
    x = round((low + high) / 2, 1)
    code, out, err = run_cli("compare", sim_like, "--at-interactivity", x,
                             "--output-dir", tmp_path / "cmp")  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"at {x:g} tok/s/user, K 4 delivers "), lines[0]
    # one round a point: K 4 reads highest, but its lead is no result (the Ks that ran)
    assert lines[0].endswith("over K 1 (highest of K 1..2, 4; not resolved: fewer than 3 rounds "
                             "a side (K 2: 1, K 4: 1))")  # fmt: skip
    decision = json.loads((tmp_path / "cmp" / "compare.json").read_text())["decision"]
    assert decision["best"] == "K 4" and lines[0] == decision["headline"]
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert page.index("<h2>") == page.index("<h2>Decision</h2>")


def test_a_load_only_sweep_alone_is_refused_in_one_line(run_cli, tmp_path: Path) -> None:
    sweep = load_sweep(tmp_path / "c", 1.0)
    code, _, err = run_cli("compare", sweep)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{sweep}: expected a sweep over K (num_speculative_tokens)")
    assert lines[0].endswith("its points vary only concurrency")


def test_one_run_alone_is_a_usage_error(run_cli, tmp_path: Path) -> None:
    from comparekit import write_run

    run = write_run(tmp_path / "r", requests=4)
    code, _, err = run_cli("compare", run)
    assert code == 2
    assert "expected two or more run or sweep directories, or one sweep directory over K" in err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "1e9"])
def test_at_interactivity_out_of_bounds_is_a_usage_error(
    run_cli, sim_like: Path, value: str
) -> None:
    code, _, err = run_cli("compare", sim_like, "--at-interactivity", value)
    assert code == 2
    assert "--at-interactivity: expected tok/s/user in (0, 1e+06]" in err
