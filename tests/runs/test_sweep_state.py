"""A sweep's bookkeeping in process (``runs.sweep.Sweep`` and ``cli.sweep``'s runner with bench's
point replaced by a run directory written here): which points feed the statistics and sweep.csv,
what each point costs in bootstraps, how many points a sweep file may ask for, and the AL range.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pointkit import write_run
from speclens.cli import app
from speclens.cli import sweep as sweep_cli
from speclens.runs import points as points_mod
from speclens.runs import sweep as sw
from speclens.runs import sweep_file, sweep_points, sweep_server
from speclens.runs.points import FIGURES, point_figures


def a_run(run: Path, i: int) -> Path:
    """Point ``i``'s run: four requests whose figures differ from every other point's."""
    base = 0.01 * (i + 1)
    return write_run(run, [base, base * 1.5, base * 2, base * 1.2], [4, 5, 4, 6], [i % 4, 3, 2, 4])


# --------------------------------------------------------------------- item 10: bootstraps
@pytest.mark.parametrize("rounds", [1, 2])
def test_each_point_costs_one_bootstrap_not_every_earlier_points_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: int
) -> None:
    """Recording point n recomputed the statistics of all n points (N(N+1)/2 bootstraps in
    all); now each point is bootstrapped once, when it is recorded, and the statistics equal
    ``point_figures`` over the setting's rounds read afresh."""
    calls = []
    real = points_mod.bootstrap_interval

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(points_mod, "bootstrap_interval", counting)
    loads = [("concurrency", float(c)) for c in (1, 2, 4, 8, 16)]
    state = sw.Sweep(tmp_path, "load", rounds, {"concurrency": [1, 2, 4, 8, 16]}, seed=3)
    state.points = sweep_points.points_for(sweep_points.ServerSetting(None), loads, rounds)
    for i, point in enumerate(state.points):
        a_run(tmp_path / point.dir, i)
        state.record(point, 0)
    per_point = len(FIGURES) - 1  # every figure but the realized AL (its own SE)
    assert len(calls) == per_point * len(state.points), len(calls)
    monkeypatch.setattr(points_mod, "bootstrap_interval", real)
    written = json.loads((tmp_path / "sweep.json").read_text())
    for stats in written["stats"]:
        members = [p for p in state.points if p.settings == stats["settings"]]
        fresh = point_figures([tmp_path / p.dir for p in members], seed=3)
        assert stats["rounds_ok"] == rounds
        assert stats["figures"] == {k: v.to_json() for k, v in fresh.items()}


# ------------------------------------------------------------------ item 12: failed points
def fake_bench(codes: dict[str, int]) -> Any:
    """bench's point replaced: the run directory written (records and all), then the exit
    code that ``codes`` names for the point (0 when not named)."""
    seen: list[str] = []

    def bench_point(options: Any, _slos: Any, _prompts: Any) -> int:
        run = Path(options.output_dir)
        seen.append(run.name)
        a_run(run, len(seen))
        return codes.get(run.name, 0)

    return bench_point


def sweep_in_process(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sweep", "--model", "dummy", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def rows(root: Path) -> dict[str, dict[str, str]]:
    return {r["id"]: r for r in csv.DictReader(io.StringIO((root / "sweep.csv").read_text()))}


def test_failed_points_feed_neither_the_statistics_nor_sweep_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed verdict (1), too many failed requests (3) and inconclusive (4): their rows keep
    their status and code but no figures, rounds_ok leaves them out, and each setting's figures
    are those of its rounds that finished ok."""
    codes = {"c1-r1": 1, "c2-r0": 3, "c4-r0": 4, "c4-r1": 3}
    monkeypatch.setattr(sweep_cli, "_bench_point", fake_bench(codes))
    out = tmp_path / "out"
    code, output = sweep_in_process("--url", "http://127.0.0.1:9", "--concurrency", "1,2,4",
                                    "--rounds", "2", "--output-dir", out)  # fmt: skip
    assert code == 3, output
    data = json.loads((out / "sweep.json").read_text())
    by_id = {p["id"]: p for p in data["points"]}
    table = rows(out)
    for pid, expected in codes.items():
        assert by_id[pid]["status"] == "failed" and by_id[pid]["exit_code"] == expected
        assert all(table[pid][f"{f}_mean"] == "" for f in FIGURES), table[pid]
    for pid in ("c1-r0", "c2-r1"):
        assert table[pid]["realized_al_mean"] != "" and by_id[pid]["status"] == "ok"
    stats = {s["settings"]["concurrency"]: s for s in data["stats"]}
    assert [stats[c]["rounds_ok"] for c in (1, 2, 4)] == [1, 1, 0]
    for c, pid in ((1, "c1-r0"), (2, "c2-r1")):
        alone = point_figures([out / "points" / pid], seed=0)
        assert stats[c]["figures"] == {k: v.to_json() for k, v in alone.items()}
    assert all(f["method"] == "none" for f in stats[4]["figures"].values())


class FakeServer:
    """``sweep_server.Server``'s start, death and stop without a process: it dies after ``lives`` points."""

    lives = 1
    checks = 0

    def start(self) -> str | None:
        return None

    def died(self) -> str | None:
        FakeServer.checks += 1
        return "the server exited with code -9 during the sweep" if FakeServer.checks >= FakeServer.lives else None  # fmt: skip

    def stop(self) -> None:
        return None


def test_a_point_whose_server_died_after_it_loses_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point ran (exit 0), then its server was found dead: it is failed (3), and its
    figures must leave sweep.csv and its setting's statistics with it."""
    monkeypatch.setattr(sweep_cli, "_bench_point", fake_bench({}))
    for name in ("start", "died", "stop"):
        monkeypatch.setattr(sweep_server.Server, name, getattr(FakeServer, name))
    FakeServer.checks, FakeServer.lives = 0, 2
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "engines": [{"name": "e", "command": f"{sys.executable} -c pass {{port}} {{k}}"}],
        "axes": {"num_speculative_tokens": [2], "concurrency": [1]},
    }))  # fmt: skip
    out = tmp_path / "out"
    code, output = sweep_in_process("--sweep-file", sweep_file, "--rounds", "3",
                                    "--output-dir", out)  # fmt: skip
    assert code == 3, output
    data = json.loads((out / "sweep.json").read_text())
    statuses = {p["id"]: (p["status"], p["exit_code"]) for p in data["points"]}
    assert statuses == {"e-k2-c1-r0": ("ok", 0), "e-k2-c1-r1": ("failed", 3),
                        "e-k2-c1-r2": ("failed", 3)}  # fmt: skip
    assert rows(out)["e-k2-c1-r1"]["output_tokens_per_s_mean"] == ""
    (stats,) = data["stats"]
    assert stats["rounds_ok"] == 1
    alone = point_figures([out / "points" / "e-k2-c1-r0"], seed=0)
    assert stats["figures"] == {k: v.to_json() for k, v in alone.items()}
    assert "e-k2-c1-r1: failed (-, AL -)" in output


# ----------------------------------------------------------------- item 9: too many points
def engines_of(tmp_path: Path, document: dict[str, Any]) -> list[sweep_file.Engine]:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(document))
    return sweep_file.load_sweep_file(path)


def test_the_point_count_is_the_product_of_the_axes(tmp_path: Path) -> None:
    engines = engines_of(tmp_path, {
        "engines": [
            {"name": "a", "command": f"{sys.executable} {{port}} {{k}} {{al}}",
             "axes": {"acceptance_length": [1.5, 2.0, 2.5], "request_rate": [1.0, 2.0, 4.0]}},
            {"name": "b", "command": f"{sys.executable} {{port}} {{k}}",
             "axes": {"concurrency": [1, 2]}},
        ],
        "axes": {"num_speculative_tokens": list(range(2, 12))},
    })  # fmt: skip
    assert sweep_points.engine_points(engines[0], None, None, 2) == (10 * 3 * 3 * 2, "10 K x 3 AL x 3 loads x 2 rounds")  # fmt: skip
    assert sweep_points.engine_points(engines[1], None, None, 2)[0] == 10 * 1 * 2 * 2
    assert sweep_points.points_problem(engines, None, None, 2) is None
    assert sweep_points.points_problem(None, [1, 2, 3], None, 100) is None
    line = sweep_points.points_problem(None, list(range(1, 102)), None, 100)
    assert line == "command line: --concurrency: 10,100 points (101 loads x 100 rounds): expected at most 10,000"  # fmt: skip
    big = sweep_points.points_problem(engines, None, None, 100)
    assert big == (f"{tmp_path / 'sweep.yaml'}: axes: 11,000 points (engines[0] a: 10 K x 3 AL "
                   "x 3 loads x 100 rounds): expected at most 10,000")  # fmt: skip


# ----------------------------------------------------------------------- item 13: AL K + 1
def test_an_al_of_k_plus_one_is_in_range(tmp_path: Path) -> None:
    """AL K + 1 (every draft accepted) is the top of [1, K + 1]: planned, not refused; a step
    above it is refused."""
    engines = engines_of(tmp_path, {
        "engines": [{"name": "e", "command": f"{sys.executable} {{port}} {{k}} {{al}}"}],
        "axes": {"num_speculative_tokens": [1, 4], "acceptance_length": [1.0, 2.0]},
    })  # fmt: skip
    settings = sweep_cli._settings(engines[0], [], [], None)  # type: ignore[arg-type]
    assert [(s.k, s.al) for s, _ in settings] == [(1, 1.0), (1, 2.0), (4, 1.0), (4, 2.0)]
    engines = engines_of(tmp_path, {
        "engines": [{"name": "e", "command": f"{sys.executable} {{port}} {{k}} {{al}}"}],
        "axes": {"num_speculative_tokens": [4], "acceptance_length": [5.0]},
    })  # fmt: skip
    assert [(s.k, s.al) for s, _ in sweep_cli._settings(engines[0], [], [], None)] == [(4, 5.0)]  # type: ignore[arg-type]


# ------------------------------------------------- the golden curve's AL against the records
def test_the_golden_curves_al_is_pooled_from_the_ok_points_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--write-profile``'s AL at each K is 1 + accepted / verify steps summed over the measured,
    successful requests of that K's points that finished ok, checked against the records
    themselves (the end-to-end tier forces the curve back, which a wrong pooling survives)."""
    failed = {"e-k4-c1-r1": 1}
    seen: list[str] = []

    def bench_point(options: Any, _slos: Any, _prompts: Any) -> int:
        run = Path(options.output_dir)
        seen.append(run.name)
        i = len(seen)
        write_run(run, [0.01] * 3, [4 + i, 3, 2 * i], [i, 2, 3 + i % 2])
        with (run / "records.jsonl").open("a") as fh:  # neither is evidence
            for extra in ({"warmup": True, "success": True}, {"warmup": False, "success": False}):
                fh.write(json.dumps({**extra, "category": "random", "spec_decode_acceptance": {
                    "num_spec_steps": 50, "num_accepted_draft_tokens": 50 * (i % 3)}}) + "\n")  # fmt: skip
        return failed.get(run.name, 0)

    monkeypatch.setattr(sweep_cli, "_bench_point", bench_point)
    FakeServer.checks, FakeServer.lives = 0, 10**6
    for name in ("start", "died", "stop"):
        monkeypatch.setattr(sweep_server.Server, name, getattr(FakeServer, name))
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "engines": [{"name": "e", "command": f"{sys.executable} -c pass {{port}} {{k}}",
                     "method": "ngram", "hardware": "test-cpu"}],
        "axes": {"num_speculative_tokens": [2, 4], "concurrency": [1]},
    }))  # fmt: skip
    out, curve = tmp_path / "out", tmp_path / "curve.yaml"
    code, output = sweep_in_process("--sweep-file", sweep_file, "--rounds", "2", "--output-dir",
                                    out, "--write-profile", curve, "--num-requests", "3")  # fmt: skip
    assert code == 1, output  # the failed round's verdict; the curve is written all the same
    data = json.loads((out / "sweep.json").read_text())
    expected = {}
    for k in (2, 4):
        accepted = steps = 0
        for point in data["points"]:
            if point["settings"]["num_speculative_tokens"] != k or point["status"] != "ok":
                continue
            for line in (out / point["dir"] / "records.jsonl").read_text().splitlines():
                row = json.loads(line)
                if row["warmup"] or not row["success"]:
                    continue
                accepted += row["spec_decode_acceptance"]["num_accepted_draft_tokens"]
                steps += row["spec_decode_acceptance"]["num_spec_steps"]
        expected[k] = round(1 + accepted / steps, 4)
    profiles = yaml.safe_load(curve.read_text())["profiles"]
    assert {p["num_spec_tokens"]: p["acceptance_length"] for p in profiles} == expected
    assert expected[2] != expected[4]
