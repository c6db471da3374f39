"""Each field the run readers check, named in one line when it is wrong (``runs.rundir``
``summary_problems`` for a measured run, ``aggregate_problems`` for published figures): one field
broken at a time in an otherwise valid summary gives exactly that field's line."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from aggregatekit import summary
from comparekit import write_run
from speclens.runs import rundir

Edit = Callable[[dict[str, Any]], None]


def _set(*path: str, value: Any) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return edit


def _drop(key: str) -> Edit:
    return lambda data: data.pop(key)


AGGREGATE: list[tuple[str, Edit, str]] = [
    ("provenance.source", _set("provenance", "source", value=5),
     "provenance.source: expected null or a name, got 5"),
    ("provenance.run_url", _set("provenance", "run_url", value="h" * 2049),
     "provenance.run_url: expected null or a URL, got 'hhhh"),
    ("provenance", _set("provenance", value="inferencex"),
     "provenance: expected null or an object, got 'inferencex'"),
    ("latency dist", _set("figures", "latency_ms", "tpot", value=[10.0]),
     "figures.latency_ms.tpot: expected null or an object, got [10.0]"),
    ("latency", _set("figures", "latency_ms", value=None),
     "figures.latency_ms: expected an object, got None"),
    ("latency stat", _set("figures", "latency_ms", "ttft", "p99", value=-1),
     "figures.latency_ms.ttft.p99: expected null or milliseconds >= 0, got -1"),
    ("al", _set("figures", "acceptance", value={"acceptance_length": 0.5}),
     "figures.acceptance.acceptance_length: expected null or a number >= 1, got 0.5"),
    ("acceptance", _set("figures", "acceptance", value=3),
     "figures.acceptance: expected null or an object, got 3"),
    ("throughput", _set("figures", "throughput", value=3),
     "figures.throughput: expected null or an object, got 3"),
    ("throughput figure", _set("figures", "throughput", "output_tokens_per_s", value=-1.0),
     "figures.throughput.output_tokens_per_s: expected null or tokens/s >= 0, got -1.0"),
    ("figures", _drop("figures"),
     "figures: expected the published figures (an object), got nothing"),
    ("lengths", _set("settings", "input_tokens", value={"min": 9, "max": 8}),
     "settings.input_tokens: expected null or {min, max}: integers, min <= max, got "),
    ("name", _set("settings", "hardware", value="x" * 257),
     "settings.hardware: expected null or a chip name, got 'xxx"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "line"), [c[1:] for c in AGGREGATE], ids=[c[0] for c in AGGREGATE]
)
def test_each_published_field_is_named_alone(edit: Edit, line: str) -> None:
    data = copy.deepcopy(summary())
    assert rundir.aggregate_problems(data, "s.json") == []
    edit(data)
    problems = rundir.aggregate_problems(data, "s.json")
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"s.json: {line}"), problems[0]


MEASURED: list[tuple[str, Edit, str]] = [
    ("server", _set("server", value="vllm"), "server: expected null or an object, got 'vllm'"),
    ("acceptance", _set("server", "acceptance", value=3),
     "server.acceptance: expected an object, got 3"),
    ("duration", _set("figures", "duration_s", value=-0.5),
     "figures.duration_s: expected seconds >= 0, got -0.5"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "line"), [c[1:] for c in MEASURED], ids=[c[0] for c in MEASURED])
def test_each_measured_field_is_named_alone(tmp_path: Path, edit: Edit, line: str) -> None:
    run = write_run(tmp_path / "r", requests=4)
    data = orjson.loads((run / "summary.json").read_bytes())
    data.setdefault("server", {}).setdefault("acceptance", {})
    assert rundir.summary_problems(data, "s.json") == []
    edit(data)
    assert rundir.summary_problems(data, "s.json") == [f"s.json: {line}"]
