"""``speclens demo -k`` is bounded like every other K option, before anything starts."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize("k", ["0", "65", "1000000000"])
def test_demo_refuses_a_k_outside_the_bound_before_starting(run_cli: Any, k: str) -> None:
    code, _, err = run_cli("demo", "-k", k)
    assert code == 2
    assert "K is in [1, 64]" in re.sub(r"[│\s]+", " ", err)  # the usage box may wrap it


class _Server:
    """Stands in for the ``speclens serve`` process the demo starts: the demo's load goes to a
    loopback server in this process instead, so its own settings, summary and report are real."""

    returncode = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.command = args[0]

    def poll(self) -> None:
        return None

    def send_signal(self, sig: int) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        pass


def _forced_reply() -> Any:
    """A response at the demo's golden AL 3.78, K = 7: 50 verify steps, 11 accepting 2 drafts
    and 39 accepting 3 (the 22/78 split), 50 + 139 + 1 = 190 tokens."""
    from hostile.garbage_server import Reply, sse

    stats = {
        "mean_acceptance_length": 3.78, "draft_acceptance_rate": 139 / 350,
        "acceptance_histogram": {"2": 11, "3": 39}, "num_accepted_draft_tokens": 139,
        "num_draft_tokens": 350, "num_spec_steps": 50, "num_spec_tokens": 7,
    }  # fmt: skip
    choice = {
        "index": 0,
        "text": "x",
        "finish_reason": "length",
        "speculative_decoding_stats": stats,
    }
    usage = {"prompt_tokens": 32, "completion_tokens": 190, "total_tokens": 222}
    return Reply(
        chunks=sse({"id": "c", "object": "text_completion", "choices": [choice], "usage": usage})
    )


@pytest.mark.timeout(60)
def test_the_demo_records_its_settings_and_its_report_shows_them(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's report showed "-" for model, server, load, requests, dataset and sampling: its
    summary.json recorded none of the settings the run knew."""
    import types

    from hostile.garbage_server import GarbageServer, Reply
    from speclens.cli import demo as demo_module

    started: list[_Server] = []

    def popen(*args: Any, **kwargs: Any) -> _Server:
        started.append(_Server(*args, **kwargs))
        return started[-1]

    fake = types.SimpleNamespace(
        Popen=popen, STDOUT=subprocess.STDOUT, TimeoutExpired=subprocess.TimeoutExpired
    )
    out = tmp_path / "demo"
    with GarbageServer(_forced_reply(), get={"/health": Reply(body=b"ok")}) as server:
        monkeypatch.setattr(demo_module, "subprocess", fake)
        monkeypatch.setattr(demo_module, "_free_port", lambda: server.port)
        code, stdout, stderr = run_cli(
            "demo", "--num-requests", "6", "--concurrency", "3", "--max-tokens", "40",
            "--output-dir", out,
        )  # fmt: skip
    assert code == 0, stdout + stderr
    assert len(started) == 1 and "serve" in started[0].command
    table = _settings_table((out / "report.html").read_text())
    assert table["model"] == "dummy"
    assert table["server"] == server.url
    assert table["load"] == "concurrency 3"
    assert table["requests"] == "6"
    assert table["dataset"] == "random"
    assert table["sampling"] == "max tokens 40, ignore-eos yes, temperature 0.00"
    assert "-" not in {table[k] for k in ("model", "server", "load", "requests", "dataset")}
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["demo"] is True and settings["resolution"]["acceptance_length"] == 3.78
    assert settings["model"] == "dummy" and settings["url"] == server.url
    assert settings["concurrency"] == 3 and settings["request_rate"] is None
    assert settings["num_requests"] == 6 and settings["dataset"] == "random"
    assert settings["max_tokens"] == 40 and settings["ignore_eos"] is True
    assert settings["temperature"] == 0.0 and settings["num_speculative_tokens"] == 7
    assert len(settings["prompts_sha256"]) == 64
    assert set(settings["host"]) == {"load_average", "cpus", "steal_percent"}


def _settings_table(page: str) -> dict[str, str]:
    """The report's Settings table, row header -> cell text."""
    start = page.index(">Settings<")
    body = page[start : page.index("</table>", start)]
    rows = re.findall(r"<tr><th[^>]*>(.*?)</th><td[^>]*>(.*?)</td></tr>", body, re.S)
    return {
        html.unescape(re.sub(r"<[^>]+>", "", k)): html.unescape(re.sub(r"<[^>]+>", "", v))
        for k, v in rows
    }
