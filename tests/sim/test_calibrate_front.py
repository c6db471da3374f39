"""``calibrate`` never writes a ``fit.front_latency_s`` its own readers refuse (over 60 s): the
fit is refused in one line where the value is found, and nothing is written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from speclens.cli._common import seconds
from speclens.cost import StepCost
from speclens.runs.report import RecordStream
from speclens.runs.trace import Trace, TraceRequest
from speclens.sim import calibrate, run_output
from speclens.sim.calibrate import (
    MAX_FRONT_LATENCY,
    CalibrationError,
    document,
    fit,
    observe,
    read_cost_file,
)
from speclens.sim.replay import replay, settings

K = 4
#: The cost tests/sim/test_replay.py fits, whose runs with a front end of 50 ms calibrate to a
#: front latency of 50 ms: every price and the front end scaled by one factor scale the fit's.
TRUE = StepCost(base=0.004, per_token=0.0, per_seq=0.0015, per_context_token=2e-6,
                draft_base=0.0, draft_per_token=0.0, prefill_base=0.003,
                prefill_per_token=4e-5)  # fmt: skip
FRONT = 0.05


def _scaled(cost: StepCost, factor: float) -> StepCost:
    return StepCost(**{f.name: getattr(cost, f.name) * factor for f in fields(cost)})


def _requests(n: int, seed: int) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        hist = {j: int(c) for j, c in enumerate(rng.multinomial(12, [0.3, 0.2, 0.2, 0.1, 0.2]))}
        hist = {j: c for j, c in hist.items() if c}
        steps, accepted = sum(hist.values()), sum(j * c for j, c in hist.items())
        out.append(TraceRequest(i, 0.0, int(rng.integers(16, 200)), int(rng.integers(64, 160)),
                                "random", steps, accepted, hist))  # fmt: skip
    return out


def _run(out: Path, concurrency: int, scale: float) -> Path:
    """A run at ``concurrency`` whose steps ``TRUE`` priced and whose server's front end held each
    request ``FRONT`` seconds, every time scaled by ``scale``."""
    reqs = _requests(8 * concurrency, seed=10 + concurrency)
    t = Trace(Path("synthetic"), "run", reqs, concurrency, K, "dummy",
              {"model": "dummy", "max_tokens": 160, "ignore_eos": True, "temperature": 0.0,
               "concurrency": concurrency})  # fmt: skip
    result = replay(t, _scaled(TRUE, scale), K, 256, 8192, 0, FRONT * scale)
    server = {"engine": "speclens", "version": "test", "model": "dummy",
              "acceptance": {"num_speculative_tokens": K, "forced": False}}  # fmt: skip
    summary = run_output.summary(result.records, result.makespan, settings(t, "cost", 0, K),
                                 server, {})  # fmt: skip
    with RecordStream(out) as stream:
        for record in result.records:
            stream.write(record)
    (out / "summary.json").write_bytes(orjson.dumps(summary))
    return out


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Runs at concurrency 1 and 4 of a server 2,000 times slower: its front end holds each
    request 100 s."""
    root = tmp_path_factory.mktemp("slow")
    return [_run(root / f"c{c}", c, 2000.0) for c in (1, 4)]


def test_a_front_latency_over_a_minute_is_refused_where_it_is_fitted(slow: list[Path]) -> None:
    with pytest.raises(CalibrationError) as caught:
        fit([observe(run) for run in slow])
    (line,) = caught.value.lines
    prefix = ("calibrate: fit.front_latency_s: the requests that found the server idle waited a "
              "median ")  # fmt: skip
    assert line.startswith(prefix) and line.endswith(
        " s beyond their prefill's price, expected at most 60 s (a server's front end: HTTP, "
        "tokenizing); their TTFTs hold a wait no step pays: check the runs' TTFTs"
    ), line
    median = float(line[len(prefix) :].split(" s ")[0])
    assert median == pytest.approx(FRONT * 2000, rel=0.05)


def test_the_command_writes_nothing_its_readers_refuse(
    slow: list[Path], tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    out = tmp_path / "cost.yaml"
    code, stdout, stderr = run_cli("calibrate", *slow, "-o", out)
    assert code == 1, stdout
    (line,) = stderr.strip().splitlines()
    assert line.startswith("calibrate: fit.front_latency_s: "), line
    assert not out.exists()


def test_a_front_latency_under_the_bound_is_written_and_read_back(tmp_path: Path) -> None:
    """The same server 1,000 times slower: 50 s, within the bound, written as fitted."""
    runs = [_run(tmp_path / f"c{c}", c, 1000.0) for c in (1, 4)]
    cost, report = fit([observe(run) for run in runs])
    assert report["front_latency_s"] == pytest.approx(FRONT * 1000, rel=0.05)
    assert report["front_latency_s"] <= MAX_FRONT_LATENCY
    out = tmp_path / "cost.yaml"
    out.write_text(orjson.dumps(document([observe(run) for run in runs], cost, report)).decode())
    read, meta = read_cost_file(out)
    assert asdict(read) == asdict(cost) and meta["front_latency_s"] == report["front_latency_s"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("clean")
    return [_run(root / f"c{c}", c, 1.0) for c in (1, 4)]


def test_prices_print_in_the_unit_that_reads_them(
    clean: list[Path], tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    """prefill_per_token 40 us, base 4 ms: never "40000.00 us" nor "0.004 ms"."""
    code, stdout, stderr = run_cli("calibrate", *clean, "-o", tmp_path / "cost.yaml")
    assert code == 0, stderr
    line = stdout.splitlines()[0]
    assert " us per prompt token" in line and " ms per request" in line, line
    assert "warning" not in stdout
    assert yaml.safe_load((tmp_path / "cost.yaml").read_text())["fit"]["unusable"] is None


def test_a_fit_over_the_bound_says_it_is_unusable(
    clean: list[Path], tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Where the fit's median decode-time error on its own runs is over the bound (here the
    bound is lowered to 0 to make any fit cross it), the terminal and the cost file say so, and
    every replay with the file repeats it."""
    monkeypatch.setattr(calibrate, "UNUSABLE", 0.0)
    cost = tmp_path / "cost.yaml"
    code, stdout, stderr = run_cli("calibrate", *clean, "-o", cost)
    assert code == 0, stderr
    assert "warning: unusable for prediction: the fit's median decode-time error" in stdout
    assert "unusable for prediction" in yaml.safe_load(cost.read_text())["fit"]["unusable"]
    code, _, stderr = run_cli("sim", "--trace", clean[1], "--step-cost", cost)
    assert code == 0 and "unusable for prediction" in stderr


@pytest.mark.parametrize("value, shown", [(46.9224, "46.9 s"), (0.0469224, "46.9 ms"),
                                          (4.69224e-5, "46.9 us"), (4.7e-8, "47 ns"), (0, "0 s")])  # fmt: skip
def test_seconds_reads_in_its_unit(value: float, shown: str) -> None:
    assert seconds(value) == shown
