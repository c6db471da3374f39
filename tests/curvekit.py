"""Published points made by the simulator from a known roofline (deepseek-v3 on 8 x h200, TP 8,
FP8), as ``speclens import`` would write them: what ``calibrate --acceptance-from
--write-profile`` is tested on where InferenceX's own data is not needed (the AL curve's CLI
and hostile tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speclens.sim import catalog
from speclens.sim.closed_loop import Load, schedule
from speclens.sim.roofline import Efficiency, Roofline

TRUTH = Efficiency(compute=0.3, memory=0.6, overhead=4e-3)
FRONT = 0.08


def point(path: Path, c: int, k: int | None = None, al: float = 1.0, **changes: Any) -> Path:
    """An aggregate-only run at concurrency ``c`` (speculating at K ``k`` and AL ``al`` when
    ``k`` is given) whose figures the known roofline predicts; ``changes`` edit its settings."""
    settings = {"model": "deepseek-v3", "hardware": "h200", "engine": "sglang", "precision": "fp8",
                "tensor_parallel": 8, "expert_parallel": 1, "dp_attention": False, "gpus": 8,
                "disaggregated": False, "input_tokens": {"min": 1024, "max": 1024},
                "output_tokens": {"min": 256, "max": 256}, "concurrency": c,
                "method": "mtp" if k else None, "num_spec_tokens": k, "date": "2026-05-27",
                "dataset": "random", **changes}  # fmt: skip
    model = catalog.with_precision(catalog.model("deepseek-v3"), "fp8")
    roof = Roofline(model, catalog.chip("h200"), 8, "mtp" if k else None, efficiency=TRUTH)
    figures = schedule(Load(c, 1024, 256, k or 0, al)).figures(roof, FRONT, 8).summary_figures()
    path.mkdir(parents=True)
    (path / "summary.json").write_text(
        json.dumps({"aggregate_only": True, "settings": settings, "figures": figures})
    )
    return path


def off_points(root: Path) -> Path:
    """The MTP-off run at concurrency 2, 4, 16 and 64 (a sweep directory) the fit is made on."""
    for c in (2, 4, 16, 64):
        point(root / "points" / f"c{c}", c)
    return root
