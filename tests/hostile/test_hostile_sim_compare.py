"""The settings a simulated run records for compare (sampling, GPUs, the acceptance's source,
the settings schema) are checked when read: a bad value is one line naming file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speclens.runs.rundir import InputError, summary_problems

GOOD = {"model": "m", "max_tokens": 8, "ignore_eos": True, "temperature": 0.0,
        "concurrency": 2, "request_rate": None, "prompts_sha256": None, "stream": None,
        "endpoint": None, "sampling": "simulated", "gpus": 8, "acceptance_source": "s",
        "acceptance_profile": None, "settings_schema": "speclens.settings/2"}  # fmt: skip


def _summary(**settings: Any) -> dict[str, Any]:
    return {"settings": {**GOOD, **settings}, "figures": {"duration_s": 1.0}}


def test_good_settings_pass() -> None:
    assert summary_problems(_summary(), "s.json") == []


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("sampling", "streamed", "null or 'simulated'"),
        ("sampling", 1, "null or 'simulated'"),
        ("gpus", 0, "null or an integer in [1, 4096]"),
        ("gpus", "8", "null or an integer in [1, 4096]"),
        ("gpus", True, "null or an integer in [1, 4096]"),
        ("gpus", 10**9, "null or an integer in [1, 4096]"),
        ("acceptance_source", "x" * 257, "null or a name"),
        ("acceptance_profile", ["p"], "null or a name"),
        ("settings_schema", 2, "null or a schema name"),
        ("settings_schema", "", "null or a schema name"),
    ],
)
def test_a_bad_value_is_named(field: str, value: Any, expected: str) -> None:
    problems = summary_problems(_summary(**{field: value}), "s.json")
    assert len(problems) == 1
    assert problems[0].startswith(f"s.json: settings.{field}: expected {expected}")


def test_compare_refuses_a_run_with_a_bad_gpu_count(tmp_path: Path) -> None:
    from speclens.runs.compare_inputs import read_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(_summary(gpus=-3)))
    (run / "records.jsonl").write_text("")
    with pytest.raises(InputError) as err:
        read_run(run)
    assert err.value.lines == [
        f"{run / 'summary.json'}: settings.gpus: expected null or an integer in [1, 4096], got -3"
    ]
    assert err.value.code == 1
