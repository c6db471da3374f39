"""``speclens sim --sweep num_spec_tokens=... --sweep concurrency=... --at-interactivity X``: the
K x concurrency grid, each K's output tok/s/GPU at X on its own Pareto curve (checked against
numbers worked out by hand here), the winning K on the first line, and a repeated axis refused."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import yaml

from scenariokit import kimi_k3
from speclens.sim.decide import NO_INTERVAL, at, decide, pareto

SCENARIO = kimi_k3(requests=64)
#: The registry's golden AL of Kimi-K3 DSpark (thinking on, coding) at K 1..8.
GOLDEN = [1.84, 2.45, 2.87, 3.22, 3.44, 3.54, 3.78, 3.88]


def _row(tpot_ms: float, out_tok_s: float, al: float = 2.0) -> dict[str, Any]:
    return {
        "throughput": {"output_tokens_per_s": out_tok_s},
        "latency_ms": {"tpot": {"mean": tpot_ms}},
        "resolution": {"acceptance_length": al},
    }


def test_interpolation_on_each_ks_pareto_curve_by_hand() -> None:
    # K 1 on 2 GPUs: tok/s/user 1000/TPOT = 100, 50, 25; tok/s/GPU = out / 2 = 100, 200, 300;
    # a dominated point (40 tok/s/user, 150 tok/s/GPU: the 50/200 point beats it) is dropped.
    k1 = [_row(10, 200), _row(20, 400), _row(40, 600), _row(25, 300)]
    # K 2: 1000/TPOT = 80, 40 -> 250, 400 tok/s/GPU.
    k2 = [_row(12.5, 500, 2.5), _row(25, 800, 2.5)]
    decision = decide([(1, r) for r in k1] + [(2, r) for r in k2], target=45.0, gpus=2)
    one, two = decision["ks"]
    # K 1 at 45: between (25, 300) and (50, 200): 300 + (200 - 300) * (45 - 25) / (50 - 25) = 220.
    assert one["tok_s_gpu"] == 220.0
    assert [(p["tok_s_user"], p["tok_s_gpu"]) for p in one["curve"]] == [
        (25.0, 300.0), (50.0, 200.0), (100.0, 100.0)
    ]  # fmt: skip
    # K 2 at 45: between (40, 400) and (80, 250): 400 - 150 * 5 / 40 = 381.25.
    assert two["tok_s_gpu"] == 381.25
    assert decision["best"] == 2 and decision["best_tok_s_gpu"] == 381.25
    assert one["ratio_to_best"] == 220.0 / 381.25 and two["ratio_to_best"] == 1.0
    assert decision["interval"] == NO_INTERVAL
    # +73.3% = 381.25 / 220 - 1.
    assert decision["headline"] == (
        "at 45 tok/s/user, K 2 delivers 381 output tok/s/GPU, +73.3% over K 1 (best of K 1..2)"
    )


def test_a_k_whose_curve_does_not_reach_the_target_says_so() -> None:
    assert pareto([(10.0, 5.0), (20.0, 5.0)]) == [(20.0, 5.0)]
    assert at([(30.0, 1.0), (60.0, 2.0)], 29.9) is None
    assert at([(30.0, 1.0), (60.0, 2.0)], 60.1) is None
    # K 1 spans 20..50 tok/s/user; K 3 spans only 50..100 (no extrapolation below 50).
    rows = [(1, _row(50, 100)), (1, _row(20, 40)), (3, _row(20, 90)), (3, _row(10, 30))]
    decision = decide(rows, target=30.0, gpus=1)
    one, three = decision["ks"]
    # K 1 at 30: between (20, 100) and (50, 40): 100 - 60 * 10 / 30 = 80.
    assert one["tok_s_gpu"] == 80.0
    assert three["tok_s_gpu"] is None and three["ratio_to_best"] is None
    assert three["reason"] == "its curve spans 50.0 to 100.0 tok/s/user, not 30"
    assert decision["best"] == 1
    assert decision["headline"].endswith("; K 3 do not reach 30 tok/s/user (see the table)")
    nobody = decide(rows, target=10.0, gpus=1)
    assert nobody["best"] is None
    assert nobody["headline"].startswith("at 10 tok/s/user, no K reaches that interactivity")


def _scenario(tmp_path: Path, requests: int = 64) -> Path:
    path = tmp_path / "scenario.yaml"
    data = json.loads(json.dumps(SCENARIO))
    data["workload"]["requests"] = requests
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_repeated_axis_is_refused_in_one_line(run_cli, tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    code, out, err = run_cli(
        "sim", path, "--sweep", "concurrency=8,16", "--sweep", "concurrency=32"
    )
    assert code == 2 and out == ""
    assert err.strip() == (
        "--sweep: concurrency is given twice; give each axis once (a grid: --sweep "
        "num_spec_tokens=... --sweep concurrency=...)"
    )
    code, _, err = run_cli("sim", path, "--sweep", "num_spec_tokens=1..8", "--sweep",
                           "concurrency=1..9")  # fmt: skip
    assert code == 2 and "8 x 9 = 72 points, over the limit of 64" in err
    code, _, err = run_cli("sim", path, "--sweep", "num_spec_tokens=1..2", "--at-interactivity",
                           "40")  # fmt: skip
    assert code == 2 and "--at-interactivity needs --sweep concurrency=" in err


def test_the_grid_answers_on_its_first_line(run_cli, tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    grid = ["--sweep", "num_spec_tokens=1..8", "--sweep", "concurrency=4,16,64", "--jobs", "1"]
    code, out, err = run_cli("sim", path, *grid, "--at-interactivity", "100", "--json")
    assert code == 0, err
    document = json.loads(out)
    points, decision = document["points"], document["decision"]
    assert [(p["sweep"]["num_spec_tokens"], p["sweep"]["concurrency"]) for p in points] == [
        (k, c) for k in range(1, 9) for c in (4, 16, 64)
    ]
    # Each K resolves its own golden AL from the registry.
    assert [e["acceptance_length"] for e in decision["ks"]] == GOLDEN
    # Recompute each K's figure from its points, here: the Pareto curve and the straight line.
    expected: dict[int, float | None] = {}
    for k in range(1, 9):
        pts = sorted(
            (1000 / p["latency_ms"]["tpot"]["mean"], p["throughput"]["output_tokens_per_s"] / 8)
            for p in points
            if p["sweep"]["num_spec_tokens"] == k
        )
        front = [q for q in pts if not any(o[0] >= q[0] and o[1] > q[1] for o in pts)]
        expected[k] = None
        for (x0, y0), (x1, y1) in itertools.pairwise(front):
            if x0 <= 100 <= x1:
                expected[k] = y0 + (y1 - y0) * (100 - x0) / (x1 - x0)
    got = {e["num_spec_tokens"]: e["tok_s_gpu"] for e in decision["ks"]}
    assert got.keys() == expected.keys()
    for k, value in expected.items():
        assert value is not None and abs(got[k] - value) < 1e-9 * value, (k, got[k], value)
    best = max(expected, key=lambda k: expected[k] or 0.0)
    assert decision["best"] == best
    code, text, err = run_cli("sim", path, *grid, "--at-interactivity", "100")
    assert code == 0, err
    first = text.splitlines()[0]
    assert first == decision["headline"]
    match = re.fullmatch(
        r"at 100 tok/s/user, K (\d) delivers ([\d,]+) output tok/s/GPU, \+[\d.]+% over K 1 "
        r"\(best of K 1\.\.8\)",
        first,
    )
    assert match, first
    assert int(match[1]) == best and match[2] == f"{expected[best]:,.0f}"
    assert NO_INTERVAL in text and text.index("at 100 tok/s/user, 8 GPUs") < text.index(
        "speclens sim"
    )


def test_the_sweep_report_opens_with_the_decision(run_cli, tmp_path: Path) -> None:
    path = _scenario(
        tmp_path, requests=128
    )  # twice the top concurrency: its warm-up, as many measured
    out_dir = tmp_path / "grid"
    code, _, err = run_cli("sim", path, "--sweep", "num_spec_tokens=1..2", "--sweep",
                           "concurrency=4,64", "--at-interactivity", "120",
                           "--output-dir", out_dir, "--jobs", "1")  # fmt: skip
    assert code == 0, err
    decision = json.loads((out_dir / "decision.json").read_text())
    page = (out_dir / "report.html").read_text()
    assert page.index("<h2>Decision</h2>") < page.index("<caption>Sweep</caption>")
    assert decision["headline"] in page
    best = decision["ks"].index(max(decision["ks"], key=lambda e: e["tok_s_gpu"]))
    field = f'data-field="decision.ks[{best}].tok_s_gpu">{decision["best_tok_s_gpu"]:,.0f}<'
    assert field in page
    sweep = json.loads((out_dir / "sweep.json").read_text())
    assert sweep["axes"] == {"num_speculative_tokens": [1, 2], "concurrency": [4, 64]}
    assert [p["id"] for p in sweep["points"]] == ["k1-c4-r0", "k1-c64-r0", "k2-c4-r0",
                                                  "k2-c64-r0"]  # fmt: skip
    # Without the flag, a stale decision does not stay behind.
    code, _, err = run_cli("sim", path, "--sweep", "concurrency=4", "--output-dir", out_dir)
    assert code == 0, err
    assert not (out_dir / "decision.json").exists()
    assert "Decision" not in (out_dir / "report.html").read_text()


def test_the_shipped_example_answers_which_k_at_40_tok_s_user(run_cli) -> None:
    """The issue's question on the shipped scenario (Kimi-K3 on 8 x B300, the golden curve's AL
    for each K): one K wins at 40 tok/s/user, named on the first line."""
    example = Path(__file__).resolve().parents[2] / "examples" / "kimi-k3-dspark.yaml"
    code, out, err = run_cli("sim", example, "--sweep", "num_spec_tokens=1..8", "--sweep",
                             "concurrency=8,16,32,64,128,256", "--at-interactivity", "40")  # fmt: skip
    assert code == 0, err
    first = out.splitlines()[0]
    assert re.fullmatch(r"at 40 tok/s/user, K [1-8] delivers [\d,]+ output tok/s/GPU, "
                        r"\+[\d.]+% over K 1 \(best of K 1\.\.8\)", first), first  # fmt: skip
