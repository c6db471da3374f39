"""``speclens calibrate`` on published points it must refuse: one line naming the file and the
field, exit 1, and no cost file written (nothing half-written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aggregatekit import summary, write_point


def _sweep(root: Path, *changes: dict[str, Any]) -> Path:
    for c, change in zip((4, 16, 64), changes, strict=False):
        write_point(root / "points" / f"c{c}", summary(concurrency=c, tpot_p50=10.0 + c / 4,
                                                       **change))  # fmt: skip
    return root


def _refused(run_cli: Any, tmp_path: Path, *args: str | Path) -> str:
    out = tmp_path / "cost.yaml"
    code, stdout, stderr = run_cli("calibrate", *args, "-o", out)
    assert code == 1, stdout + stderr
    assert not out.exists()
    assert "Traceback" not in stdout + stderr
    return stderr


def test_a_disaggregated_point_without_its_pools_is_refused(run_cli: Any,
                                                            tmp_path: Path) -> None:  # fmt: skip
    """Disaggregated points are priced at their prefill and decode pools: one that states none
    (or a pool a layout cannot describe) is refused in one line naming the field."""
    root = _sweep(tmp_path / "s", {}, {}, {})
    data = summary(concurrency=128, tpot_p50=30.0)
    data["settings"]["disaggregated"] = True
    write_point(root / "points" / "c128", data)
    err = " ".join(_refused(run_cli, tmp_path, root).split())
    assert "c128/summary.json: settings.prefill: expected an object" in err


def test_points_of_two_chips_are_refused(run_cli: Any, tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", {}, {})
    b = _sweep(tmp_path / "b", {"hardware": "h200"})
    err = _refused(run_cli, tmp_path, a, b)
    assert "settings.hardware: the points differ (h200, mi355x)" in err


def test_fewer_than_three_points_are_refused(run_cli: Any, tmp_path: Path) -> None:
    err = _refused(run_cli, tmp_path, _sweep(tmp_path / "s", {}, {}))
    assert "2 published point(s), at least 3 needed" in err


@pytest.mark.parametrize("value, shown", [(-3.0, "-3.0"), (float("nan"), "nan"), (0, "0")])
def test_a_bad_tpot_is_named(run_cli: Any, tmp_path: Path, value: float, shown: str) -> None:
    root = _sweep(tmp_path / "s", {}, {}, {})
    path = root / "points" / "c16" / "summary.json"
    data = json.loads(path.read_text())
    data["figures"]["latency_ms"]["tpot"]["p50"] = value
    path.write_text(json.dumps(data))  # NaN as JSON's NaN token, as Python writes it
    err = _refused(run_cli, tmp_path, root)
    assert err.count("\n") == 1, err
    assert str(path) in err
    assert ("figures.latency_ms.tpot.p50: expected a number > 0, got " + shown in err
            or (shown == "nan" and "not JSON" in err))  # fmt: skip


def test_a_chip_other_than_the_points_is_a_usage_error(run_cli: Any, tmp_path: Path) -> None:
    root = _sweep(tmp_path / "s", {}, {}, {})
    code, _, err = run_cli("calibrate", root, "--hardware", "h200", "-o", tmp_path / "c.yaml")
    assert code == 2 and "--hardware: 'h200', but the points ran 'mi355x'" in err
    assert not (tmp_path / "c.yaml").exists()
