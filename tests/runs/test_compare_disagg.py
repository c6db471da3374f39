"""``compare`` on disaggregated points: the deployment check compares each pool, so two splits
of the same GPUs (1 prefill worker and 3 decode workers against 3 and 1) are two deployments,
and the same split agrees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aggregatekit import summary, write_point


def _point(path: Path, prefill: int, decode: int) -> Path:
    data = summary(concurrency=64, hardware="gb200", engine="dynamo-trt", gpus=32)
    data["settings"].update(disaggregated=True, **{
        name: {"tensor_parallel": 8, "expert_parallel": 8, "dp_attention": False,
               "workers": workers, "gpus": 8 * workers}
        for name, workers in (("prefill", prefill), ("decode", decode))})  # fmt: skip
    return write_point(path, data)


def _deployment(run_cli: Any, a: Path, b: Path) -> dict[str, Any]:
    code, out, err = run_cli("compare", a, b, "--json")
    assert code in (0, 1), err
    (pair,) = json.loads(out)["pairs"]
    return {c["name"]: c for c in pair["checks"]}["deployment"]


def test_two_splits_of_the_same_gpus_are_two_deployments(run_cli, tmp_path: Path) -> None:
    one = _point(tmp_path / "p1-d3", 1, 3)
    other = _point(tmp_path / "p3-d1", 3, 1)
    check = _deployment(run_cli, one, other)
    assert check["ok"] is False
    assert "prefill" in check["detail"] and "decode" in check["detail"]
    assert _deployment(run_cli, one, _point(tmp_path / "again", 1, 3))["ok"] is True
