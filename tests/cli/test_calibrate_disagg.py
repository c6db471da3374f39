"""``speclens calibrate`` and ``sim --trace`` on disaggregated published points of several
layouts: one fit prices every layout of one chip and engine (each point at its own pools), the
AL a disaggregated MTP run implies is the one that made it, and the replay reproduces the
points and says which layouts it never saw.

The points are made by ``speclens.sim.disagg`` from a roofline of known efficiencies, as an
engine of those layouts would have published them; the fit starts from the chip's defaults and
must find predictions that reproduce them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregatekit import summary, write_point, write_sweep
from speclens.sim import catalog
from speclens.sim import fit_points as fp
from speclens.sim.closed_loop import Load
from speclens.sim.disagg import figures as disagg_figures
from speclens.sim.roofline import Efficiency, Roofline

TRUTH = Efficiency(compute=0.2, memory=0.6, overhead=5e-3, per_sequence=0.0, per_token=2e-6,
                   prefill_compute=0.1)  # fmt: skip
FRONT = 0.05
LAYOUTS = {  # prefill (workers, GPUs, TP, EP, DP attention), decode (the same)
    "narrow": ((1, 8, 8, 8, True), (2, 16, 8, 8, False)),
    "wide": ((2, 16, 8, 8, True), (1, 16, 16, 16, True)),
}


def _settings(c: int, layout: str, **changes: Any) -> dict[str, Any]:
    base = summary(concurrency=c, hardware="gb200", engine="dynamo-trt", precision="fp4")
    settings = base["settings"]
    pools = {}
    for name, (workers, gpus, tp, ep, dpa) in zip(("prefill", "decode"), LAYOUTS[layout],
                                                  strict=True):  # fmt: skip
        pools[name] = {"tensor_parallel": tp, "expert_parallel": ep, "dp_attention": dpa,
                       "workers": workers, "gpus": gpus}  # fmt: skip
    settings.update(disaggregated=True, gpus=pools["prefill"]["gpus"] + pools["decode"]["gpus"],
                    tensor_parallel=pools["decode"]["tensor_parallel"],
                    expert_parallel=pools["decode"]["expert_parallel"],
                    dp_attention=pools["decode"]["dp_attention"], **pools, **changes)  # fmt: skip
    return settings


def _point(c: int, layout: str, k: int = 0, al: float = 1.0, **changes: Any) -> dict[str, Any]:
    """A published point whose figures the truth predicts at its own pools."""
    settings = _settings(c, layout, **changes)
    model = catalog.with_precision(catalog.model("deepseek-r1"), "fp4")
    roof = Roofline(model, catalog.chip("gb200"), efficiency=TRUTH, method="mtp" if k else None)
    point = fp.Point(Path("made"), settings, 1.0, 1.0, 1.0)
    figures = disagg_figures(Load(c, 1024, 1024, k, al), fp.pools(roof, point), FRONT,
                             settings["gpus"]).summary_figures()  # fmt: skip
    return {"aggregate_only": True, "settings": settings, "figures": figures}


def _off(root: Path) -> Path:
    points = [_point(c, layout) for layout, cs in (("narrow", (4, 64, 512)), ("wide", (256, 2048)))
              for c in cs]  # fmt: skip
    for p in points:
        write_point(root / "points" / f"{p['settings']['decode']['gpus']}-c"
                    f"{p['settings']['concurrency']}", p)  # fmt: skip
    return root


def test_one_fit_prices_every_layout_and_infers_the_al(run_cli, tmp_path: Path) -> None:
    """Five points of two layouts: the fit reproduces each within 3%, and a disaggregated MTP
    run at K 3 made at AL 2.4 implies 2.4."""
    mtp = write_point(tmp_path / "mtp", _point(16, "narrow", 3, 2.4, method="mtp",
                                               num_spec_tokens=3))  # fmt: skip
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", _off(tmp_path / "off"), "-o", out,
                                "--acceptance-from", mtp)  # fmt: skip
    assert code == 0, err
    said = " ".join(stdout.split())
    assert "on gb200 (2 layouts, each point priced at its own)" in said
    written = yaml.safe_load(out.read_text())
    assert written["fit"]["tpot_error_median"] < 0.03
    assert written["fit"]["throughput_error_median"] < 0.03
    assert len(written["fit"]["layouts"]) == 2
    assert "prefill_compute" in written["roofline"]["efficiency"]
    # within 0.02: without the MTP drafter priced on the decode pool it comes out 2.35
    assert written["acceptance"]["acceptance_length"] == pytest.approx(2.4, abs=0.02)


def test_the_replay_reproduces_the_points_and_names_an_unseen_layout(run_cli,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "cost.yaml"
    code, _, err = run_cli("calibrate", _off(tmp_path / "off"), "-o", out)
    assert code == 0, err
    unseen = _point(128, "narrow")
    unseen["settings"]["decode"] = {**unseen["settings"]["decode"], "workers": 4, "gpus": 32}
    unseen["settings"]["gpus"] = 40
    trace = write_sweep(tmp_path / "trace", [_point(64, "narrow"), unseen])
    code, stdout, err = run_cli("sim", "--trace", trace, "--step-cost", out, "--json")
    assert code == 0, err
    result = json.loads(stdout)
    (row,) = [r for r in result["points"] if r["concurrency"] == 64]
    assert row["tpot_ms"]["predicted"] == pytest.approx(row["tpot_ms"]["trace"], rel=0.03)
    notes = " ".join(" ".join(result["notes"]).split())
    assert "decode 4 x (TP 8, EP 8) are priced at their own layout" in notes


@pytest.mark.parametrize(
    "pool, change, shown",
    [("decode", {"workers": 0}, "settings.decode.workers: expected an integer from 1 to 1024, "
                                "got 0"),
     ("prefill", {"workers": 5}, "settings.prefill.gpus: 8 GPUs do not split into 5 workers"),
     ("decode", {"expert_parallel": 32}, "settings.decode.expert_parallel: expected an integer "
                                         "from 1 to 8 (a worker's GPUs), got 32")],
)  # fmt: skip
def test_a_layout_the_data_cannot_describe_is_refused(run_cli, tmp_path: Path, pool: str,
                                                       change: dict[str, Any],
                                                       shown: str) -> None:  # fmt: skip
    """Zero workers, GPUs that do not split into the workers, EP wider than a worker: one line
    naming the field, exit 1, nothing written (calibrate and the replay alike)."""
    root = _off(tmp_path / "off")
    bad = _point(32, "narrow")
    bad["settings"][pool] = {**bad["settings"][pool], **change}
    write_point(root / "points" / "bad", bad)
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", root, "-o", out)
    assert code == 1 and not out.exists() and "Traceback" not in stdout + err
    assert f"bad/summary.json: {shown}" in " ".join(err.split())
    code, _, err = run_cli("sim", "--trace", root)
    assert code == 1 and f"bad/summary.json: {shown}" in " ".join(err.split())
