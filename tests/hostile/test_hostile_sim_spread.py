"""``speclens sim --acceptance-spread FILE`` and ``--slo`` given what they cannot take: a bad spread
file, a spread at another K or around another AL, a spread with no value to spread, a path
that simulates the mean only, an SLO on a figure no simulated request keeps. Each is one line
naming the file (or the option) and the field, before anything is simulated or written."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
QUANTILES = {"p0": 1.5, "p5": 2.0, "p10": 2.3, "p25": 2.8, "p50": 3.4, "p75": 4.0, "p90": 4.5,
             "p95": 4.8, "p100": 5.0}  # fmt: skip
AL = "3.3925"  # the quantiles' implied mean
AT_K3 = dict(zip(QUANTILES, [1.5, 2.0, 2.3, 2.8, 3.4, 3.7, 3.8, 3.9, 4.0], strict=True))
GOOD = {"num_spec_tokens": 4, "quantiles": QUANTILES, "requests": 200}
SCENARIO: dict[str, Any] = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "mtp", "num_spec_tokens": 4}},
                              "step_cost": {"base": 0.01}}]},
    "workload": {"input_tokens": 16, "output_tokens": 16, "concurrency": 2, "requests": 8},
}  # fmt: skip


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def _spread(tmp_path: Path, **changes: Any) -> Path:
    data = copy.deepcopy(GOOD)
    data.update(changes)
    path = tmp_path / "spread.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"quantiles": {**QUANTILES, "p50": 2.0}}, "quantiles", "fall from p25 2.8 to p50 2"),
        ({"quantiles": {**QUANTILES, "p100": 6.5}}, "quantiles", "outside [1, K + 1] = [1, 5]"),
        ({"requests": 5}, "requests", "20"),
        ({"num_spec_tokens": 3, "quantiles": AT_K3}, "num_spec_tokens",
         "is 3, but the run speculates K 4: a spread is refused at another K, never rescaled"),
        ({"quantiles": {k: min(v + 0.2, 5.0) for k, v in QUANTILES.items()}}, "quantiles",
         "from the stated acceptance_length 3.3925, beyond the tolerance 0.05"),
    ],
)  # fmt: skip
def test_a_bad_spread_is_one_line_naming_the_file_and_field(
    run_cli, tmp_path: Path, scenario: Path, changes: dict, field: str, words: str
) -> None:
    """Falling quantiles, one past K + 1, too few requests, another K, a mean away from the
    AL: refused before the run, and --output-dir never written."""
    spread = _spread(tmp_path, **changes)
    out_dir = tmp_path / "run"
    code, out, err = run_cli("sim", scenario, "--acceptance-length", AL, "--acceptance-spread",
                             spread, "--output-dir", out_dir)  # fmt: skip
    assert code == 1
    line = _one_line(err)
    assert line.startswith(f"{spread}: {field}: "), line
    assert words in line, line
    assert out == "" and not out_dir.exists()


def test_a_spread_at_one_k_is_refused_at_another_swept_k(
    run_cli, tmp_path: Path, scenario: Path
) -> None:
    """A K sweep resolves the command line's value at each K: the spread stated at K 4 is
    refused at K 3, never rescaled, before any point runs."""
    spread = _spread(tmp_path)
    code, out, err = run_cli("sim", scenario, "--acceptance-length", AL, "--acceptance-spread",
                             spread, "--sweep", "num_spec_tokens=3,4")  # fmt: skip
    assert code == 1 and out == ""
    assert _one_line(err) == (f"{spread}: num_spec_tokens: is 4, but the run speculates K 3: a "
                              "spread is refused at another K, never rescaled")  # fmt: skip


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "(file): cannot be read"),
        ("- 1\n- 2\n", "(document): expected a mapping, got list"),
        ("num_spec_tokens: 4\nrequests: 200\n", "quantiles: "),
        ("quantiles: {p0: 1}\nnum_spec_tokens: 4\nrequests: 200\n", "quantiles"),
    ],
)
def test_an_unreadable_or_malformed_spread_file_is_refused(
    run_cli, tmp_path: Path, scenario: Path, content: str | None, words: str
) -> None:
    spread = tmp_path / "spread.yaml"
    if content is not None:
        spread.write_text(content)
    code, out, err = run_cli("sim", scenario, "--acceptance-length", AL,
                             "--acceptance-spread", spread)  # fmt: skip
    assert code == 1 and out == ""
    line = err.strip().splitlines()[0]
    assert line.startswith(f"{spread}: ") and words in line, err


def test_a_directory_for_a_spread_file_is_refused(run_cli, tmp_path: Path, scenario: Path) -> None:
    code, _, err = run_cli("sim", scenario, "--acceptance-length", AL,
                           "--acceptance-spread", tmp_path)  # fmt: skip
    assert code == 1
    assert _one_line(err).startswith(f"{tmp_path}: (file): ")


def test_a_spread_needs_the_value_it_spreads(run_cli, tmp_path: Path, scenario: Path) -> None:
    """Without an AL on the command line the spread would be laid over another layer's value:
    refused (exit 2), never merged."""
    code, out, err = run_cli("sim", scenario, "--acceptance-spread", _spread(tmp_path))
    assert code == 2 and out == ""
    assert _one_line(err).startswith("command line: --acceptance-spread: goes with "
                                     "--acceptance-length")  # fmt: skip


def test_paths_that_simulate_the_mean_only_refuse_a_spread_and_an_slo(
    run_cli, tmp_path: Path
) -> None:
    """A disaggregated deployment's steady state and a replay (--trace) have no per-request
    AL to draw: a spread or an SLO on them is one line, exit 2."""
    spread = _spread(tmp_path)
    disagg = ROOT / "examples" / "dsr1-gb200-disagg.yaml"
    for flags in (("--acceptance-length", AL, "--acceptance-spread", spread),
                  ("--slo", "tpot:20")):  # fmt: skip
        code, out, err = run_cli("sim", disagg, *flags)
        assert code == 2 and out == ""
        assert "a disaggregated deployment is simulated in its steady state from the mean AL" in (
            _one_line(err)
        )
        trace = tmp_path / "trace.jsonl"
        trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 8}\n')
        code, out, err = run_cli("sim", "--trace", trace, *flags)
        assert code == 2 and out == ""
        assert "goes with a scenario; a replay (--trace) keeps each recorded request's own" in (
            _one_line(err)
        )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("itl:50", "itl is not simulated per request"),
        ("tpot:-5", "tpot: expected milliseconds > 0, got -5"),
        ("tpot:0", "tpot: expected milliseconds > 0, got 0"),
        ("tpot:nan", "tpot: expected milliseconds > 0"),
        ("tpot:inf", "tpot: expected milliseconds > 0"),
        ("tpot:fast", "'fast' is not a number of milliseconds"),
        ("tpot:10,tpot:20", "tpot is given twice"),
        ("p99:10", "expected NAME:MS"),
        ("", "expected NAME:MS"),
    ],
)
def test_a_bad_slo_is_one_line_before_any_run(
    run_cli, scenario: Path, text: str, words: str
) -> None:
    code, out, err = run_cli("sim", scenario, "--slo", text)
    assert code == 2 and out == ""
    line = _one_line(err)
    assert line.startswith("command line: --slo: ") and words in line, line


def test_an_slo_does_not_go_with_the_k_schedule(run_cli, scenario: Path) -> None:
    code, _, err = run_cli("sim", scenario, "--sweep", "num_spec_tokens=2,4", "--sweep",
                           "concurrency=1,2", "--context", "1k", "--slo", "tpot:20")  # fmt: skip
    assert code == 2
    assert _one_line(err).startswith("command line: --slo: does not go with --context")
