"""Hostile published files given to ``speclens import``: each is refused with one line naming the
file, the point and the field, exit 1, and nothing is written (the output directory is never
made)."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from publishedkit import metrics, point, refused, vllm_result, write_points, write_vllm
from speclens.runs import published_read


def without(mapping: dict, key: str) -> dict:
    return {k: v for k, v in mapping.items() if k != key}


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (without(point(), "metrics"), "[1].metrics: expected the published metrics (an object), got nothing"),
        (point(metrics=metrics() | {"median_tpot": -0.01}), "[1].metrics.median_tpot: expected seconds > 0, got -0.01"),
        (point(metrics=metrics() | {"median_tpot": float("nan")}), "[1].metrics.median_tpot: expected seconds > 0, got nan"),
        (point(conc=0), "[1].conc: expected an integer >= 1, got 0"),
        (point(metrics=metrics() | {"p99_ttft": float("inf")}), "[1].metrics.p99_ttft: expected null or seconds >= 0, got inf"),
        (point(hardware="../../etc"), "[1].hardware: expected a name"),
        ("not a point", "[1]: expected a point (a JSON object), got 'not a point'"),
    ],
    ids=["no-metrics", "negative-tpot", "nan-tpot", "concurrency-0", "inf-ttft", "path-in-a-name", "not-an-object"],
)  # fmt: skip
def test_a_bad_inferencex_point(run_cli, tmp_path, bad, expected):
    source = write_points(tmp_path / "bench.json", [point(conc=8), bad], nan=True)
    if "nan" in expected:
        assert "NaN" in source.read_text()  # the bare JSON token, as Python's json writes it
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line.startswith(f"{source}: {expected}")


def test_a_file_over_the_size_bound_is_refused_from_its_size(run_cli, tmp_path):
    """A file that would hold ~10^7 points: refused before a byte of it is read (a sparse file
    just over the bound, so the test costs nothing)."""
    source = tmp_path / "huge.json"
    with source.open("wb") as fh:
        fh.truncate(published_read.MAX_FILE_BYTES + 1)
    tracemalloc.start()
    start = time.monotonic()
    try:
        line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 5.0
    assert peak < 8 * 2**20
    assert line == (f"{source}: {published_read.MAX_FILE_BYTES + 1:,} bytes: expected a published "
                    f"file of at most {published_read.MAX_FILE_BYTES:,} bytes")  # fmt: skip


def test_too_many_points_are_refused_before_the_rest_is_decoded(run_cli, tmp_path, monkeypatch):
    """More points than the bound (here lowered to 3, as 10^7 small points would be against
    100,000): refused as the fourth starts; what follows it is never decoded."""
    monkeypatch.setattr(published_read, "MAX_POINTS", 3)
    text = "[" + ",".join(json.dumps(point(conc=c)) for c in (1, 2, 3)) + "," + "{" * 50_000
    source = tmp_path / "many.json"
    source.write_text(text)
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line == f"{source}: more than 3 points: expected at most 3"


def test_the_point_bound_is_one_hundred_thousand():
    assert published_read.MAX_POINTS == 100_000
    assert published_read.MAX_FILE_BYTES == 64 * 2**20


def test_a_file_that_is_not_json(run_cli, tmp_path):
    source = tmp_path / "bench.json"
    source.write_text('[{"hardware": "mi355x",')
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line.startswith(f"{source}: not JSON: ")


def test_copies_of_a_point_that_disagree(run_cli, tmp_path):
    a = write_points(tmp_path / "a.json", [point()])
    b = write_points(tmp_path / "b.json", [point(metrics=metrics() | {"p99_tpot": 0.5})])
    line = refused(run_cli, ["import", "inferencex", a, b], tmp_path / "out")
    assert line.startswith(f"{b}: [0].metrics.p99_tpot: expected 0.015 as the same point in {a} [0] has it, got 0.5")  # fmt: skip


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"median_tpot_ms": ...}, "median_tpot_ms: expected milliseconds > 0, got nothing"),
        ({"mean_ttft_ms": -3.0}, "mean_ttft_ms: expected null or milliseconds >= 0, got -3.0"),
        ({"median_tpot_ms": float("nan")}, "median_tpot_ms: expected milliseconds > 0, got nan"),
        ({"max_concurrency": 0}, "max_concurrency: expected null or an integer >= 1, got 0"),
        ({"model_id": ...}, "model_id: expected the model's name"),
        ({"completed": 0}, "completed: expected an integer >= 1 (requests that finished), got 0"),
        ({"output_throughput": -1}, "output_throughput: expected tokens/s >= 0, got -1"),
    ],
    ids=["missing-tpot", "negative-ttft", "nan-tpot", "concurrency-0", "no-model", "none-completed", "negative-throughput"],
)  # fmt: skip
def test_a_bad_vllm_file(run_cli, tmp_path, change, expected):
    source = write_vllm(tmp_path / "result.json", vllm_result(**change), nan=True)
    line = refused(run_cli, ["import", "vllm", source], tmp_path / "out")
    assert line.startswith(f"{source}: {expected}")


def test_a_vllm_file_that_is_a_list(run_cli, tmp_path):
    source = tmp_path / "result.json"
    source.write_text("[]")
    line = refused(run_cli, ["import", "vllm", source], tmp_path / "out")
    assert (
        line == f"{source}: expected one result object (vllm bench serve --save-result), got list"
    )


@pytest.mark.parametrize("rates", [[0.5] * 65, [0.5, 1.5], "0.5", [-0.1], []])
def test_vllm_per_position_rates_out_of_bounds(run_cli, tmp_path, rates):
    """The per-position rates give K: more than 64 of them, a rate over 1 or not a number is
    refused in one line, nothing written (as is an empty list)."""
    source = write_vllm(tmp_path / "v.json", vllm_result(
        spec_decode_acceptance_length=2.0, spec_decode_per_position_acceptance_rates=rates))  # fmt: skip
    code, _, err = run_cli("import", "vllm", source, "--output-dir", tmp_path / "run")
    assert code == 1 and "spec_decode_per_position_acceptance_rates: expected" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()
