"""Two demo runs compare: the demo's run directory records every setting compare checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_demo_options import _forced_reply, _Server


@pytest.mark.timeout(90)
def test_two_demo_runs_compare(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    from hostile.garbage_server import GarbageServer, Reply
    from speclens.cli import demo as demo_module
    from speclens.runs import compare as cmp
    from speclens.runs.compare_inputs import read_inputs

    fake = types.SimpleNamespace(
        Popen=_Server, STDOUT=subprocess.STDOUT, TimeoutExpired=subprocess.TimeoutExpired
    )
    monkeypatch.setattr(demo_module, "subprocess", fake)
    outs = [tmp_path / "one", tmp_path / "two"]
    for out in outs:
        with GarbageServer(_forced_reply(), get={"/health": Reply(body=b"ok")}) as server:
            monkeypatch.setattr(demo_module, "_free_port", lambda port=server.port: port)
            code, stdout, stderr = run_cli(
                "demo", "--num-requests", "6", "--concurrency", "3", "--max-tokens", "200",
                "--output-dir", out,
            )  # fmt: skip
        assert code == 0, stdout + stderr
    settings = json.loads((outs[0] / "summary.json").read_text())["settings"]
    assert settings["settings_schema"] == "speclens.settings/2"
    assert settings["acceptance_profile"] and settings["acceptance_source"]
    inputs = read_inputs(outs, ["A", "B"], [None, None])
    pair = cmp.compare(inputs)["pairs"][0]
    assert pair["verdict"] == "comparable", pair["label"]
    prompts = next(c for c in pair["checks"] if c["name"] == "prompts")
    assert prompts["ok"] is True and "before" not in prompts["detail"]
