"""What ``speclens sim`` prints of the tails: TPOT p90 and p99 beside the medians, goodput under
``--slo``, and what the tails rest on (the spread and where it came from, or that it is
unknown), in the terminal and in --json; ``--at-interactivity`` under ``--slo``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from speclens.acceptance.spread import SPREAD_UNKNOWN

QUANTILES = {"p0": 1.5, "p5": 2.0, "p10": 2.3, "p25": 2.8, "p50": 3.4, "p75": 4.0, "p90": 4.5,
             "p95": 4.8, "p100": 5.0}  # fmt: skip
AL = 3.3925  # the quantiles' implied mean
SPREAD = {"num_spec_tokens": 4, "quantiles": QUANTILES, "requests": 200, "source": "run 7"}
SCENARIO: dict[str, Any] = {
    "model": "kimi-k3",
    "deployment": {"pools": [{
        "engine": {"speculative": {"method": "mtp", "num_spec_tokens": 4}, "max_num_seqs": 16},
        "step_cost": {"base": 0.01, "per_token": 1e-4, "per_seq": 1e-4, "per_context_token": 1e-7,
                      "draft_base": 1e-3, "draft_per_token": 1e-5}}]},
    "workload": {"input_tokens": 32, "output_tokens": 65, "concurrency": 4, "requests": 96,
                 "acceptance": {"num_spec_tokens": 4, "acceptance_length": AL, "source": "a test"}},
}  # fmt: skip


def _write(tmp_path: Path, spread: bool, name: str = "scenario.yaml") -> Path:
    data = copy.deepcopy(SCENARIO)
    if spread:
        data["workload"]["acceptance"]["spread"] = SPREAD
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _rows(out: str, title: str) -> list[list[str]]:
    """The body rows of the table titled ``title`` in sim's terminal output, cell by cell."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


def test_sim_prints_tpot_tails_and_says_when_the_spread_is_unknown(run_cli, tmp_path) -> None:
    """Without a spread the tails are the minimum-variance schedule's: said in one line, and
    in --json (``spread``); the latency table's TPOT p90 and p99 are the JSON's."""
    path = _write(tmp_path, spread=False)
    code, out, err = run_cli("sim", path)
    assert code == 0, err
    code, text, err = run_cli("sim", path, "--json")
    assert code == 0, err
    row = json.loads(text)
    assert row["spread"] == {"simulated": False, "line": SPREAD_UNKNOWN, "source": None}
    assert SPREAD_UNKNOWN in out.splitlines()
    header, cells = _header(out), _rows(out, "latency (ms)")[0]
    tpot = row["latency_ms"]["tpot"]
    for name in ("p50", "p90", "p99"):
        assert cells[header.index(f"TPOT {name}")] == f"{tpot[name]:,.1f}"
    assert "goodput" not in row and "goodput" not in out


def _header(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "latency (ms)")
    head = next(line for line in lines[start:] if line.startswith("┃"))
    return [cell.strip() for cell in head.strip("┃").split("┃")]


def test_a_stated_spread_widens_the_printed_tails_and_names_its_source(run_cli, tmp_path) -> None:
    """The workload's inline value with a spread: each request draws its own AL, the line says
    from where (the layer, the run it was measured on), and TPOT p90 and p99 read wider than the
    same run's without it; the medians' table cell is no tail (p90 differs from p50)."""
    flat, wide = (json.loads(run_cli("sim", _write(tmp_path, s, f"{s}.yaml"), "--json")[1])
                  for s in (False, True))  # fmt: skip
    assert wide["spread"]["simulated"] is True
    assert wide["spread"]["source"] == "run 7"
    assert wide["spread"]["line"] == (
        "spread: each request draws its own AL (p10 2.30, p50 3.40, p90 4.50 over 200 "
        "requests, measured on run 7) from the workload layer's value"
    )
    assert wide["resolution"]["spread"]["quantiles"] == QUANTILES
    narrow, spread = flat["latency_ms"]["tpot"], wide["latency_ms"]["tpot"]
    assert spread["p90"] / spread["p50"] > 1.2 > narrow["p90"] / narrow["p50"]
    assert spread["p99"] > 1.3 * narrow["p99"]
    code, out, err = run_cli("sim", _write(tmp_path, True))
    assert code == 0, err
    assert wide["spread"]["line"] in out and SPREAD_UNKNOWN not in out
    header, cells = _header(out), _rows(out, "latency (ms)")[0]
    assert cells[header.index("TPOT p90")] == f"{spread['p90']:,.1f}" != f"{spread['p50']:,.1f}"


def test_an_acceptance_spread_file_goes_with_the_command_lines_al(run_cli, tmp_path) -> None:
    """``--acceptance-spread FILE`` with ``--acceptance-length``: the command line's value
    carries the file's spread, and the line names the file."""
    path = _write(tmp_path, spread=False)
    spread = tmp_path / "spread.yaml"
    spread.write_text(yaml.safe_dump({**SPREAD, "source": None}))
    code, out, err = run_cli("sim", path, "--acceptance-length", str(AL),
                             "--acceptance-spread", spread, "--json")  # fmt: skip
    assert code == 0, err
    row = json.loads(out)
    assert row["resolution"]["layer"] == "cli"
    assert row["resolution"]["spread"]["quantiles"] == QUANTILES
    assert row["spread"]["simulated"] is True
    assert row["spread"]["line"].endswith(f"over 200 requests) from --acceptance-spread {spread}")


def test_goodput_is_the_run_directorys_and_counts_per_request(run_cli, tmp_path) -> None:
    """``--slo``: the share of the measured requests meeting every limit, in the table, in one
    line and in --json, equal to what bench's summary computes from the run's records (its
    ``figures.goodput``, the warm-up left out as sim leaves it)."""
    path = _write(tmp_path, spread=True)
    out_dir = tmp_path / "run"
    code, out, err = run_cli("sim", path, "--slo", "tpot:6,ttft:100", "--json",
                             "--output-dir", out_dir)  # fmt: skip
    assert code == 0, err
    good = json.loads(out)["goodput"]
    summary = json.loads((out_dir / "summary.json").read_text())["figures"]["goodput"]
    assert summary["slo_ms"] == good["slo_ms"] == {"tpot": 6.0, "ttft": 100.0}
    assert abs(summary["fraction"] - good["fraction"]) < 1e-12
    assert abs(summary["requests_per_s"] - good["requests_per_s"]) < 1e-9
    assert 0.2 < good["fraction"] < 0.95  # the spread's slow requests miss a 6 ms TPOT
    code, out, err = run_cli("sim", path, "--slo", "tpot:6,ttft:100")
    assert code == 0, err
    cells = _rows(out, "speclens sim")[0]
    assert cells[-1] == f"{good['fraction']:.1%}"
    assert (f"goodput: the requests meeting every limit of the SLO (tpot 6 ms, ttft 100 ms): "
            f"{good['requests']:,} ({good['fraction']:.1%}), {good['requests_per_s']:.2f} req/s"
            ) in out  # fmt: skip


def test_at_interactivity_under_an_slo_leaves_out_the_points_whose_tails_miss_it(
    run_cli, tmp_path
) -> None:
    """Concurrency 16's TPOT p90 misses 10 ms (its median meets it): under ``--slo tpot:10``
    the decision leaves that point out and says so, in --json and in the terminal, and its
    curve no longer reaches 150 tok/s/user; without ``--slo`` it counts every point, and
    does."""
    path = _write(tmp_path, spread=True)
    sweep = ("--sweep", "concurrency=1,4,16", "--at-interactivity", "150", "--jobs", "1")
    code, out, err = run_cli("sim", path, *sweep, "--slo", "tpot:10", "--json")
    assert code == 0, err
    document = json.loads(out)
    points = {p["sweep"]["concurrency"]: p["latency_ms"]["tpot"] for p in document["points"]}
    assert points[16]["p50"] < 10.0 < points[16]["p90"]
    assert all(points[c]["p90"] <= 10.0 for c in (1, 4))
    decision = document["decision"]
    assert decision["slo"] == {"slo_ms": {"tpot": 10.0}, "percentile": "p90", "left_out": 1,
                               "points": 3}  # fmt: skip
    (entry,) = decision["ks"]
    miss = f"TPOT p90 {points[16]['p90']:,.1f} ms over 10 ms"
    assert entry["left_out"] == [{"sweep": {"concurrency": 16}, "misses": [miss]}]
    assert entry["tok_s_gpu"] is None and entry["reason"].endswith("(1 of 3 points miss the SLO)")
    assert decision["headline"].endswith(
        "; 1 of 3 points left out: their per-request p90 misses the SLO (tpot 10 ms)"
    )
    code, out, err = run_cli("sim", path, *sweep, "--slo", "tpot:10")
    assert code == 0, err
    assert f"left out c=16: {miss}" in out
    code, out, err = run_cli("sim", path, *sweep, "--json")
    assert code == 0, err
    plain = json.loads(out)["decision"]
    assert "slo" not in plain and "left_out" not in plain["ks"][0]
    assert len(plain["ks"][0]["curve"]) > len(entry["curve"])
    assert plain["ks"][0]["tok_s_gpu"] is not None
