"""Hostile input to the K schedule's page and to the deployment a simulated run records: a
k_schedule.json whose strings carry markup or whose fields are mistyped, a simulated run's
summary.json whose deployment fields are not what ``sim`` writes, and an output directory that
cannot take the schedule. Each is escaped, shown as "-", or refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from reportkit import external_references, field_mismatches, scan
from speclens.runs.html import ReportError
from speclens.runs.html_schedule import write_schedule_report
from speclens.runs.rundir import InputError, summary_problems

EVIL = '<script>alert(1)</script><img src="http://x/y.png">'


def _schedule(**over: Any) -> dict[str, Any]:
    sched: dict[str, Any] = {
        "context_unit": 1024, "contexts": [1024, 4096], "tok_s_user": None, "gpus": 8,
        "rows": [{"concurrency": 4, "cells": [
            {"context": 1024, "num_spec_tokens": 2, "tok_s_gpu": 64.5, "gain": 0.42},
            {"context": 4096, "num_spec_tokens": None, "tok_s_gpu": None, "gain": None,
             "reason": EVIL}]}],
        "losses": [{"line": EVIL}], "model": EVIL, "method": EVIL,
        "deployment": {"hardware": EVIL, "tensor_parallel": "8", "precision": None},
        "acceptance": [{"num_spec_tokens": 2, "acceptance_length": "2.4", "layer": EVIL,
                        "profile": EVIL, "profile_set": EVIL, "source": EVIL}],
        "pricing": [{"line": EVIL}], "emit": {"engine": EVIL, "lines": [EVIL, 7]},
        "points": [{"context": 1024, "num_spec_tokens": 2, "concurrency": 4, "tok_s_gpu": "x",
                    "tpot_p50_ms": -1}],
    }  # fmt: skip
    return sched | over


def test_markup_in_a_schedule_is_text_and_a_mistyped_number_is_a_dash(tmp_path: Path) -> None:
    (tmp_path / "k_schedule.json").write_text(json.dumps(_schedule()))
    page = write_schedule_report(tmp_path).read_text()
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert external_references(page) == []
    parsed = scan(page)
    assert field_mismatches(parsed.fields, _schedule()) == []
    shown = {path for path, _ in parsed.fields}
    # A string where a number belongs is never rendered as a number.
    assert "deployment.tensor_parallel" not in shown
    assert "acceptance[0].acceptance_length" not in shown
    assert "<svg" not in page  # no point with a finite throughput and TPOT


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"rows": {"concurrency": 4}}, "field rows: expected a list, got dict"),
        ({"contexts": None}, "field contexts: expected a list, got NoneType"),
    ],
)
def test_a_schedule_file_of_the_wrong_shape_is_one_line(tmp_path: Path, over, message) -> None:
    (tmp_path / "k_schedule.json").write_text(json.dumps(_schedule(**over)))
    with pytest.raises(ReportError) as err:
        write_schedule_report(tmp_path)
    assert str(err.value) == f"{tmp_path / 'k_schedule.json'}: {message}"
    assert not (tmp_path / "report.html").exists()


GOOD = {"model": "m", "max_tokens": 8, "ignore_eos": True, "temperature": 0.0,
        "concurrency": 2, "request_rate": None, "prompts_sha256": None, "stream": None,
        "endpoint": None, "sampling": "simulated", "gpus": 8, "acceptance_source": None,
        "acceptance_profile": None, "settings_schema": "speclens.settings/2",
        "executor": "sim", "hardware": "b200", "engine": None, "precision": "fp8",
        "tensor_parallel": 8, "expert_parallel": 1, "dp_attention": False,
        "disaggregated": False, "method": "mtp", "num_spec_tokens": 2}  # fmt: skip


def _summary(**settings: Any) -> dict[str, Any]:
    return {"settings": {**GOOD, **settings}, "figures": {"duration_s": 1.0}}


def test_the_deployment_sim_writes_passes() -> None:
    assert summary_problems(_summary(), "s.json") == []


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("tensor_parallel", "8", "null or an integer > 0"),
        ("tensor_parallel", 0, "null or an integer > 0"),
        ("expert_parallel", True, "null or an integer > 0"),
        ("dp_attention", "yes", "null or true or false"),
        ("disaggregated", 1, "null or true or false"),
        ("hardware", "x" * 257, "null or a chip name"),
        ("engine", ["sglang"], "null or an engine name"),
        ("precision", 8, "null or a precision name"),
        ("method", {"m": 1}, "null or a method name"),
    ],
)
def test_a_bad_deployment_field_is_named(field: str, value: Any, expected: str) -> None:
    problems = summary_problems(_summary(**{field: value}), "s.json")
    assert len(problems) == 1
    assert problems[0].startswith(f"s.json: settings.{field}: expected {expected}")


def test_compare_refuses_a_simulated_run_with_a_bad_parallelism(tmp_path: Path) -> None:
    from speclens.runs.compare_inputs import read_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(_summary(tensor_parallel="x" * 100_000)))
    (run / "records.jsonl").write_text("")
    with pytest.raises(InputError) as err:
        read_run(run)
    (line,) = err.value.lines
    assert line.startswith(f"{run / 'summary.json'}: settings.tensor_parallel: expected null "
                           "or an integer > 0, got 'xxx")  # fmt: skip
    assert len(line) < 300 and err.value.code == 1


def test_an_output_dir_that_is_a_file_is_refused_before_simulating(run_cli, tmp_path) -> None:
    scenario = {"model": "kimi-k3", "hardware": "b300",
                "deployment": {"pools": [{"parallel": 8, "engine": {
                    "speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
                "workload": {"output_tokens": 8, "concurrency": 2, "requests": 4}}  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    target = tmp_path / "taken"
    target.write_text("not a directory")
    code, out, err = run_cli("sim", path, "--sweep", "num_spec_tokens=1", "--sweep",
                             "concurrency=2", "--context", "1k", "--output-dir", target)  # fmt: skip
    assert (code, out) == (2, "")
    assert err.strip() == (f"command line: --output-dir: {str(target)!r}: is not a directory, "
                           "expected a directory to write the run into")  # fmt: skip
    assert target.read_text() == "not a directory"
